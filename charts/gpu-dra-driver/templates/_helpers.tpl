{{- define "gpu-dra-driver.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-dra-driver.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpu-dra-driver.labels" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{- define "gpu-dra-driver.selector" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- /* The image reference, unquoted (callers quote it). */ -}}
{{- define "gpu-dra-driver.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpu-dra-driver.pluginServiceAccount" -}}
{{ include "gpu-dra-driver.fullname" . }}-kubelet-plugin
{{- end -}}

{{- define "gpu-dra-driver.controllerServiceAccount" -}}
{{ include "gpu-dra-driver.fullname" . }}-controller
{{- end -}}

{{- define "gpu-dra-driver.webhookName" -}}
{{ include "gpu-dra-driver.fullname" . }}-webhook
{{- end -}}

{{- define "gpu-dra-driver.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{ required "webhook.tls.secret.name is required with webhook.tls.mode=secret" .Values.webhook.tls.secret.name }}
{{- else -}}
{{ include "gpu-dra-driver.webhookName" . }}-tls
{{- end -}}
{{- end -}}

{{- /* The gates this driver has, TimeSlicingSettings=true,MPSSupport=false;
NVIDIA's other gates are checked in validate.yaml and never passed on.
dynamicMig.enabled turns DynamicMIG on. */ -}}
{{- define "gpu-dra-driver.featureGates" -}}
{{- $set := deepCopy (.Values.featureGates | default dict) -}}
{{- if include "gpu-dra-driver.dynamicMig" . -}}
{{- $_ := set $set "DynamicMIG" true -}}
{{- end -}}
{{- $gates := list -}}
{{- range $name, $on := $set -}}
{{- if has $name (list "TimeSlicingSettings" "MPSSupport" "ConsumableCapacity" "ConsumableShares" "DynamicMIG" "DRAListTypeAttributes" "PassthroughSupport") -}}
{{- $gates = append $gates (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{- /* "true" when the GPU driver is served (NVIDIA's resources.gpus.enabled,
default true), else empty. */ -}}
{{- define "gpu-dra-driver.gpus" -}}
{{- if dig "gpus" "enabled" true (.Values.resources | default dict) -}}
true
{{- end -}}
{{- end -}}

{{- /* "true" when ComputeDomains are served (NVIDIA's
resources.computeDomains.enabled), else empty. Unset, it follows the GPU
driver: off beside it, on without it (NVIDIA's ComputeDomain-only install
sets only resources.gpus.enabled=false). */ -}}
{{- define "gpu-dra-driver.computeDomains" -}}
{{- if dig "computeDomains" "enabled" (not (include "gpu-dra-driver.gpus" .)) (.Values.resources | default dict) -}}
true
{{- end -}}
{{- end -}}

{{- /* "true" when dynamic MIG is on (dynamicMig.enabled or NVIDIA's
featureGates.DynamicMIG), else empty. */ -}}
{{- define "gpu-dra-driver.dynamicMig" -}}
{{- if or (dig "enabled" false (.Values.dynamicMig | default dict)) (get (.Values.featureGates | default dict) "DynamicMIG") -}}
true
{{- end -}}
{{- end -}}

{{- /* dynamicMig.gpus as the plugin's --dynamic-mig-gpus value: auto,
none, or the list joined with commas. */ -}}
{{- define "gpu-dra-driver.dynamicMigGpus" -}}
{{- $gpus := dig "gpus" "auto" (.Values.dynamicMig | default dict) -}}
{{- if kindIs "slice" $gpus -}}
{{- $items := list -}}
{{- range $gpus -}}
{{- $items = append $items (ternary (printf "%d" (int64 .)) (toString .) (or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .))) -}}
{{- end -}}
{{- join "," $items -}}
{{- else -}}
{{- toString $gpus -}}
{{- end -}}
{{- end -}}

{{- /* The log filter: logLevel, or NVIDIA's logVerbosity when set. */ -}}
{{- define "gpu-dra-driver.logLevel" -}}
{{- $verbosity := ternary (toString .Values.logVerbosity) "" (hasKey .Values "logVerbosity") -}}
{{- if eq $verbosity "" -}}
{{ .Values.logLevel }}
{{- else if lt (atoi $verbosity) 4 -}}
info
{{- else if lt (atoi $verbosity) 6 -}}
debug
{{- else -}}
trace
{{- end -}}
{{- end -}}

{{- /* The kubelet's directories; NVIDIA's names win when given. */ -}}
{{- define "gpu-dra-driver.pluginsDir" -}}
{{ .Values.kubeletPlugin.kubeletPluginsDirectoryPath | default .Values.kubeletPlugin.pluginsDir }}
{{- end -}}
{{- define "gpu-dra-driver.registryDir" -}}
{{ .Values.kubeletPlugin.kubeletRegistrarDirectoryPath | default .Values.kubeletPlugin.registryDir }}
{{- end -}}

{{- /* Leader election: the boolean, or NVIDIA's object (whose durations
win over controller.leaseDuration and the rest). Yields a dict as JSON. */ -}}
{{- define "gpu-dra-driver.leaderElection" -}}
{{- $ctl := .Values.controller -}}
{{- $le := dict "enabled" true "leaseDuration" $ctl.leaseDuration "renewDeadline" $ctl.renewDeadline "retryPeriod" $ctl.retryPeriod -}}
{{- if kindIs "map" $ctl.leaderElection -}}
{{- $_ := set $le "enabled" (ternary $ctl.leaderElection.enabled true (hasKey $ctl.leaderElection "enabled")) -}}
{{- range $k := list "leaseDuration" "renewDeadline" "retryPeriod" -}}
{{- if hasKey $ctl.leaderElection $k -}}{{- $_ := set $le $k (get $ctl.leaderElection $k) -}}{{- end -}}
{{- end -}}
{{- else -}}
{{- $_ := set $le "enabled" $ctl.leaderElection -}}
{{- end -}}
{{- toJson $le -}}
{{- end -}}

{{- /* A duration (the grammar of values.schema.json's "duration") in
nanoseconds, with the controller's integer arithmetic: decimals are
billionths of their unit, truncated. */ -}}
{{- define "gpu-dra-driver.durationNs" -}}
{{- $units := dict "ns" 1 "us" 1000 "µs" 1000 "ms" 1000000 "s" 1000000000 "m" 60000000000 "h" 3600000000000 -}}
{{- $total := 0 -}}
{{- range $part := regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" (toString .) -1 -}}
{{- $number := regexFind "^[0-9.]+" $part -}}
{{- $unit := get $units (trimPrefix $number $part) | int64 -}}
{{- $pieces := splitList "." $number -}}
{{- $total = add $total (mul (atoi (first $pieces)) $unit) -}}
{{- if gt (len $pieces) 1 -}}
{{- $billionths := atoi (trunc 9 (printf "%s000000000" (last $pieces))) -}}
{{- if ge $unit 1000000000 -}}
{{- $total = add $total (mul $billionths (div $unit 1000000000)) -}}
{{- else -}}
{{- $total = add $total (div (mul $billionths $unit) 1000000000) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- /* Fails unless the duration `value` at `path` has the grammar and lies
in [min, max] (nanoseconds), as the controller's `flag` requires. */ -}}
{{- define "gpu-dra-driver.checkDuration" -}}
{{- $text := toString .value -}}
{{- if or (gt (len $text) 32) (not (regexMatch "^(0|([0-9]{1,6}(\\.[0-9]{1,9})?(ns|us|µs|ms|s|m|h))+)$" $text)) -}}
{{- fail (printf "%s is %q: not a duration such as 30s, 1m30s, 1.5h or 250ms (at most 6 digits and 9 decimals a part, 32 characters; units ns, us, ms, s, m, h)" .path $text) -}}
{{- end -}}
{{- $ns := include "gpu-dra-driver.durationNs" $text | int64 -}}
{{- if or (lt $ns (int64 .min)) (gt $ns (int64 .max)) -}}
{{- fail (printf "%s is %s: outside %s's range %s to %s" .path $text .flag .minText .maxText) -}}
{{- end -}}
{{- end -}}

{{- /* Fails unless the host path `value` at `path` matches `pattern`,
saying `why`. */ -}}
{{- define "gpu-dra-driver.checkPath" -}}
{{- if not (regexMatch .pattern (toString .value)) -}}
{{- fail (printf "%s is %q: %s" .path (toString .value) .why) -}}
{{- end -}}
{{- end -}}

{{- /* The webhook's match condition (CEL over the admitted object): the
claim's (or template's) requests name one of webhook.deviceClassNames, or
its config has an opaque entry for this driver. */ -}}
{{- define "gpu-dra-driver.webhookMatch" -}}
{{- $classes := list -}}
{{- range .Values.webhook.deviceClassNames -}}{{- $classes = append $classes (printf "'%s'" .) -}}{{- end -}}
{{- $in := printf "[%s]" (join ", " $classes) -}}
(request.resource.resource == 'resourceclaimtemplates' ? (has(object.spec.spec) ? [object.spec.spec] : []) : [object.spec]).exists(s, has(s.devices) && (
(has(s.devices.requests) && s.devices.requests.exists(r,
(has(r.exactly) && r.exactly.deviceClassName in {{ $in }}) ||
(has(r.firstAvailable) && r.firstAvailable.exists(f, f.deviceClassName in {{ $in }})))) ||
(has(s.devices.config) && s.devices.config.exists(c, has(c.opaque) && c.opaque.driver == '{{ .Values.driverName }}'))))
{{- end -}}
