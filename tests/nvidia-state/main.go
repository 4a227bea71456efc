// Command nvidia-state writes the node state that NVIDIA's DRA kubelet
// plugin (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin)
// leaves behind, byte for byte as each of its releases wrote it, for the
// tests of our plugin's adoption of that state:
//
//   - the checkpoint /var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json
//     (DriverPluginCheckpointFileBasename at every tag), written by the
//     kubelet checkpoint manager from Checkpoint.MarshalCheckpoint;
//   - a claim's CDI spec /var/run/cdi/k8s.gpu.nvidia.com-claim_<claimUID>.yaml
//     (cdiapi.GenerateTransientSpecName("k8s.gpu.nvidia.com", "claim", uid)).
//
// Usage:
//
//	nvidia-state checkpoint --format F < input.json > checkpoint.json
//	nvidia-state verify [--format F|any] < checkpoint.json
//	nvidia-state cdi-yaml --out PATH.yaml [--format F] < spec.json
//	nvidia-state formats
//
// # Formats
//
// Read from the bare mirror of the repository, `git show <tag>:<path>`, paths
// under cmd/gpu-kubelet-plugin/ unless they start with vendor/. A format is
// named by the first release that wrote it; release tags are accepted as
// names too. Every checksum is checksum.New of
// k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum (vendored alike at
// every tag): FNV-32a over hashutil.DeepHashObject of the JSON bytes, i.e.
// over the spew dump of the []byte (k8s.io/apimachinery/pkg/util/dump at
// v25.3.0, k8s.io/utils/dump later: the same ForHash config); this program
// imports that package from Kubernetes v1.37.2.
//
// v25.3 (v25.3.0, v25.3.1, v25.3.2; checkpoint.go, prepared.go,
// device_state.go, deviceinfo.go, vendor/.../kubeletplugin/draplugin.go of
// dynamic-resource-allocation v0.34): one checksum over the file written
// with "checksum":0, and only completed claims (Prepare checkpoints a claim
// once its devices are prepared):
//
//	{"checksum":N,"v1":{"preparedClaims":{UID:{"status":ResourceClaimStatus,
//	 "preparedDevices":[{"devices":[{"gpu":{"info":{"uuid":U},"device":D},"mig":null}
//	                              | {"gpu":null,"mig":{"info":{"uuid":MIGUUID},"device":D}}],
//	                     "configState":{"mpsControlDaemonID":S}}]}}}}
//	D = {"Requests":[..],"PoolName":..,"DeviceName":..,"CDIDeviceIDs":[..]}
//
// (kubeletplugin.Device has no JSON tags; GpuInfo and MigDeviceInfo export
// only UUID; "status" is always written, `omitempty` not applying to a
// struct; an empty "preparedClaims" is left out: "v1":{}.) The plugin put
// two CDI IDs in D: k8s.gpu.nvidia.com/device=<canonical name> (its base
// spec) and, if the group had container edits,
// k8s.gpu.nvidia.com/claim=<uid>-<canonical name>.
//
// v25.8 (v25.8.0, v25.8.1; + checkpointv.go): "v2" added with its own
// checksum; "v1" (ToV1) keeps only PrepareCompleted claims so that v25.3
// can still read the file (it ignores "v2", and the top checksum is
// computed with "v2" left out):
//
//	{"checksum":N1,"v1":{..as v25.3..},"v2":{"checksum":N2,"preparedClaims":{UID:
//	 {"checkpointState":"PrepareStarted"|"PrepareCompleted","status":..,"preparedDevices":[..]}}}}
//
// v25.12 (v25.12.0; checkpointv.go, prepared.go, mig.go, deviceinfo.go):
// v2 claims gain "name","namespace" (omitempty; Prepare sets them on the
// PrepareStarted entry only, the PrepareCompleted entry drops them). A MIG
// device is {"concrete":MigLiveTuple,"device":D} with MigLiveTuple =
// {"parentMinor","giId","ciId","migUUID","parentUUID"} instead of
// {"info":{"uuid"}}; PreparedDevice gains "vfio" (omitempty):
// {"info":{"uuid":U},"device":D}. CDI specs now go through nvcdi spec.Save
// (mode 0644; before: the CDI cache's WriteSpec, mode 0600).
//
// v0.4 (v0.4.0; checkpointv.go, mig.go, deviceinfo.go): "v2" gains
// "nodeBootID" (omitempty, last). D is CheckpointedDevice: dynamic-resource-
// allocation v0.36's Device gained ShareID and Metadata, written omitempty
// ("ShareID","Metadata" after "CDIDeviceIDs"). MigLiveTuple gains
// "parentPCIBusID" (omitempty), the vfio info "pciBusID" (omitempty). With
// none of these set, the bytes equal v25.12's.
//
// v0.4.1 (v0.4.1; device_state.go): configState gains "timeSliceApplied"
// (*bool, omitempty).
//
// main (HEAD 95932046, unreleased; device_state.go since 75a2d69f):
// configState is {"mpsControlDaemonID" (now omitempty),"mpsApplied"
// (omitempty),"timeSliceApplied"}: a group without MPS is written
// "configState":{} where every release wrote {"mpsControlDaemonID":""}.
// As main's VerifyChecksum re-marshals through these types, it rejects
// (CorruptCheckpointError) every older checkpoint holding such a group.
//
// A field the chosen format cannot hold is an error naming it. `verify`
// decodes and re-marshals through the chosen format's types the way that
// release's VerifyChecksum does (the v1 checksum over the file without
// "v2", then "v2"'s own); the default format is main, i.e. HEAD; `any`
// accepts a file that some format's release accepts (tried newest first)
// and names it.
//
// # Input of `checkpoint`
//
// One JSON object; unknown fields are errors:
//
//	{"bootID": "",                      // v2.nodeBootID; v0.4 on
//	 "claims": [{
//	   "uid": "...",                      // required, unique
//	   "name": "", "namespace": "",       // v2 only; v25.12 on
//	   "state": "PrepareCompleted",       // default; "PrepareStarted": v25.8 on, left out of v1
//	   "status": {...},                   // resource.k8s.io/v1 ResourceClaimStatus (v1.37.2 types); default {}
//	   "groups": [{
//	     "mpsControlDaemonID": "",
//	     "timeSliceApplied": null,        // bool: v0.4.1 on
//	     "mpsApplied": null,              // bool: main
//	     "devices": [
//	       {"kind": "gpu", "uuid": "GPU-..", COMMON},
//	       {"kind": "mig", "migUUID": "MIG-..", COMMON,
//	        "parentUUID": "GPU-..", "parentMinor": 0, "giId": 1, "ciId": 0,  // required from v25.12, refused before
//	        "parentPCIBusID": ""},                                          // v0.4 on
//	       {"kind": "vfio", "uuid": "GPU-..", "pciBusID": "", COMMON}]}]}]} // vfio: v25.12 on; pciBusID: v0.4 on
//	COMMON = "requests": [..] (absent: null), "pool": "", "device": "",
//	         "cdiDeviceIDs": [..] (absent: null),
//	         "shareID": null, "metadata": null  // v0.4 on; metadata = kubeletplugin.DeviceMetadata
//	                                            //   {"Attributes":{..},"NetworkData":{..}}
//
// Claims are keyed by UID (JSON object: sorted); groups and devices keep
// their order. Output: the file's bytes, no trailing newline.
//
// # cdi-yaml
//
// Reads a CDI spec (specs-go Spec as JSON), fills "cdiVersion" if empty with
// cdi.MinimumRequiredVersion (what nvcdi's spec builder does when no
// version is given) and writes it the way the release did: through
// tags.cncf.io/container-device-interface v1.1.0 (the version vendored from
// v25.12.0; v25.3/v25.8 vendored v1.0.1, whose write is the same:
// validateSpec, "---\n" + gopkg.in/yaml.v3 Marshal, a temporary file renamed
// into place), i.e. cdi.NewCache(WithSpecDirs(dir)).WriteSpec, and from
// v25.12 on spec.Save's chmod 0644 after it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const usage = `usage:
  nvidia-state checkpoint --format F < input.json > checkpoint.json
  nvidia-state verify [--format F|any] < checkpoint.json    (default format: main)
  nvidia-state cdi-yaml --out PATH.yaml [--format F] < spec.json
  nvidia-state formats`

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nvidia-state: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	formatName := fs.String("format", "main", "the release format")
	out := fs.String("out", "", "cdi-yaml: the file to write")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w\n%s", cmd, err, usage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q\n%s", cmd, fs.Args(), usage)
	}
	formatSet := false
	fs.Visit(func(f *flag.Flag) { formatSet = formatSet || f.Name == "format" })
	if cmd == "verify" && *formatName == "any" {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		name, err := verifyAny(data)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "checksums verify as format %s\n", name)
		return err
	}
	f, err := lookupFormat(*formatName)
	if err != nil {
		return err
	}
	switch cmd {
	case "checkpoint":
		if !formatSet {
			return errors.New("checkpoint: --format is required\n" + usage)
		}
		data, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		var in input
		if err := decodeStrict(data, &in); err != nil {
			return fmt.Errorf("reading the input: %w", err)
		}
		file, err := buildCheckpoint(f, &in)
		if err != nil {
			return err
		}
		_, err = stdout.Write(file)
		return err
	case "verify":
		data, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		if err := f.verify(data); err != nil {
			return fmt.Errorf("verify as %s: %w", f.name, err)
		}
		_, err = fmt.Fprintf(stdout, "checksums verify as format %s\n", f.name)
		return err
	case "cdi-yaml":
		if *out == "" {
			return errors.New("cdi-yaml: --out is required\n" + usage)
		}
		data, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		return writeCDIYAML(f, data, *out)
	case "formats":
		for _, f := range formats {
			if _, err := fmt.Fprintf(stdout, "%s\t%s\n", f.name, f.releases); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// verifyAny verifies data as the newest format whose release accepts it,
// returning that format's name, or every format's error.
func verifyAny(data []byte) (string, error) {
	var errs []string
	for i := len(formats) - 1; i >= 0; i-- {
		err := formats[i].verify(data)
		if err == nil {
			return formats[i].name, nil
		}
		errs = append(errs, fmt.Sprintf("as %s: %v", formats[i].name, err))
	}
	return "", fmt.Errorf("verify: no format accepts it:\n  %s", strings.Join(errs, "\n  "))
}

// writeCDIYAML writes the CDI spec given as JSON to path (a .yaml file) as
// format f's release wrote a claim's spec.
func writeCDIYAML(f *format, specJSON []byte, path string) error {
	if filepath.Ext(path) != ".yaml" {
		return fmt.Errorf("cdi-yaml: --out %s: the plugin writes .yaml specs", path)
	}
	var spec cdispec.Spec
	if err := decodeStrict(specJSON, &spec); err != nil {
		return fmt.Errorf("cdi-yaml: reading the spec: %w", err)
	}
	if strings.TrimSpace(spec.Version) == "" {
		v, err := cdi.MinimumRequiredVersion(&spec)
		if err != nil {
			return fmt.Errorf("cdi-yaml: %w", err)
		}
		spec.Version = v
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir, name := filepath.Split(abs)
	// As spec.Save: a cache of that directory alone, its refresh errors
	// (other specs there) ignored.
	cache, _ := cdi.NewCache(cdi.WithAutoRefresh(false), cdi.WithSpecDirs(dir))
	if cache == nil {
		return errors.New("cdi-yaml: no CDI cache")
	}
	if err := cache.WriteSpec(&spec, name); err != nil {
		return fmt.Errorf("cdi-yaml: %w", err)
	}
	if f.specSave {
		if err := os.Chmod(abs, 0o644); err != nil {
			return fmt.Errorf("cdi-yaml: %w", err)
		}
	}
	return nil
}
