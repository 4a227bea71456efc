package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/utils/dump"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func mustFormat(t *testing.T, name string) *format {
	t.Helper()
	f, err := lookupFormat(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func generate(t *testing.T, f *format, in string) []byte {
	t.Helper()
	var parsed input
	if err := decodeStrict([]byte(in), &parsed); err != nil {
		t.Fatalf("input: %v", err)
	}
	out, err := buildCheckpoint(f, &parsed)
	if err != nil {
		t.Fatalf("%s: %v", f.name, err)
	}
	return out
}

// oneGpu is one completed claim with one whole GPU, as every release
// prepared it (one request, one group without MPS).
const oneGpu = `{"claims":[{"uid":"uid-1","groups":[{"devices":[{"kind":"gpu","uuid":"GPU-1",
 "requests":["gpu"],"pool":"node-a","device":"gpu-0",
 "cdiDeviceIDs":["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]}]}]}]}`

// The JSON written by each release for oneGpu, from reading the tag's types
// (see main.go); checksums replaced by N.
const (
	gpuV1 = `{"status":{},"preparedDevices":[{"devices":[{"gpu":{"info":{"uuid":"GPU-1"},` +
		`"device":{"Requests":["gpu"],"PoolName":"node-a","DeviceName":"gpu-0",` +
		`"CDIDeviceIDs":["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]}},"mig":null}],` +
		`"configState":{"mpsControlDaemonID":""}}]}`
	gpuV2 = `{"checkpointState":"PrepareCompleted","status":{},"preparedDevices":[{"devices":[{"gpu":{"info":{"uuid":"GPU-1"},` +
		`"device":{"Requests":["gpu"],"PoolName":"node-a","DeviceName":"gpu-0",` +
		`"CDIDeviceIDs":["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]}},"mig":null}],` +
		`"configState":{"mpsControlDaemonID":""}}]}`
	goldenGpuV253 = `{"checksum":N,"v1":{"preparedClaims":{"uid-1":` + gpuV1 + `}}}`
	goldenGpuV258 = `{"checksum":N,"v1":{"preparedClaims":{"uid-1":` + gpuV1 + `}},` +
		`"v2":{"checksum":N,"preparedClaims":{"uid-1":` + gpuV2 + `}}}`
)

var goldenOneGpu = map[string]string{
	"v25.3":  goldenGpuV253,
	"v25.8":  goldenGpuV258,
	"v25.12": goldenGpuV258, // "vfio" omitempty; no name on a completed claim
	"v0.4":   goldenGpuV258, // nodeBootID, ShareID, Metadata omitempty
	"v0.4.1": goldenGpuV258, // timeSliceApplied omitempty
	"main":   strings.ReplaceAll(goldenGpuV258, `"configState":{"mpsControlDaemonID":""}`, `"configState":{}`),
}

var checksumRE = regexp.MustCompile(`"checksum":[0-9]+`)

func masked(b []byte) string { return checksumRE.ReplaceAllString(string(b), `"checksum":N`) }

func TestGoldenOneGpu(t *testing.T) {
	for _, f := range formats {
		got := masked(generate(t, f, oneGpu))
		if want := goldenOneGpu[f.name]; got != want {
			t.Errorf("%s:\n got %s\nwant %s", f.name, got, want)
		}
	}
}

func TestGoldenMig(t *testing.T) {
	uuidOnlyIn := `{"claims":[{"uid":"u","groups":[{"mpsControlDaemonID":"mps-1","devices":[{"kind":"mig","migUUID":"MIG-1",
	 "requests":["r"],"pool":"p","device":"gpu-0-mig-9-4-1","cdiDeviceIDs":["c"]}]}]}]}`
	concreteIn := `{"claims":[{"uid":"u","groups":[{"mpsControlDaemonID":"mps-1","devices":[{"kind":"mig","migUUID":"MIG-1",
	 "parentUUID":"GPU-1","parentMinor":3,"giId":2,"ciId":0,
	 "requests":["r"],"pool":"p","device":"gpu-0-mig-9-4-1","cdiDeviceIDs":["c"]}]}]}]}`
	dev := `"device":{"Requests":["r"],"PoolName":"p","DeviceName":"gpu-0-mig-9-4-1","CDIDeviceIDs":["c"]}`
	info := `{"gpu":null,"mig":{"info":{"uuid":"MIG-1"},` + dev + `}}`
	concrete := `{"gpu":null,"mig":{"concrete":{"parentMinor":3,"giId":2,"ciId":0,"migUUID":"MIG-1","parentUUID":"GPU-1"},` + dev + `}}`
	group := func(d string) string {
		return `[{"devices":[` + d + `],"configState":{"mpsControlDaemonID":"mps-1"}}]`
	}
	v1 := func(d string) string {
		return `"v1":{"preparedClaims":{"u":{"status":{},"preparedDevices":` + group(d) + `}}}`
	}
	v2 := func(d string) string {
		return `"v2":{"checksum":N,"preparedClaims":{"u":{"checkpointState":"PrepareCompleted","status":{},"preparedDevices":` + group(d) + `}}}`
	}
	for _, c := range []struct{ format, in, want string }{
		{"v25.3", uuidOnlyIn, `{"checksum":N,` + v1(info) + `}`},
		{"v25.8", uuidOnlyIn, `{"checksum":N,` + v1(info) + `,` + v2(info) + `}`},
		{"v25.12", concreteIn, `{"checksum":N,` + v1(concrete) + `,` + v2(concrete) + `}`},
		{"main", concreteIn, `{"checksum":N,` + v1(concrete) + `,` + v2(concrete) + `}`},
	} {
		if got := masked(generate(t, mustFormat(t, c.format), c.in)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.format, got, c.want)
		}
	}
}

// Every field from v0.4 on, in the order of their structs.
func TestGoldenMainEverything(t *testing.T) {
	in := `{"bootID":"boot-1","claims":[
	 {"uid":"u2","name":"c","namespace":"ns","state":"PrepareStarted","status":{"reservedFor":[{"resource":"pods","name":"p","uid":"pod-1"}]}},
	 {"uid":"u1","groups":[{"mpsApplied":true,"timeSliceApplied":false,"devices":[
	   {"kind":"mig","migUUID":"MIG-1","parentUUID":"GPU-1","parentMinor":0,"giId":1,"ciId":0,"parentPCIBusID":"0000:3b:00.0",
	    "requests":["r"],"pool":"p","device":"d","cdiDeviceIDs":[],"shareID":"share-1"},
	   {"kind":"vfio","uuid":"GPU-2","pciBusID":"0000:5e:00.0","metadata":{"Attributes":{"model":{"string":"H100"}}}}]}]}]}`
	mig := `{"gpu":null,"mig":{"concrete":{"parentMinor":0,"giId":1,"ciId":0,"migUUID":"MIG-1","parentUUID":"GPU-1","parentPCIBusID":"0000:3b:00.0"},` +
		`"device":{"Requests":["r"],"PoolName":"p","DeviceName":"d","CDIDeviceIDs":[],"ShareID":"share-1"}}}`
	vfio := `{"gpu":null,"mig":null,"vfio":{"info":{"uuid":"GPU-2","pciBusID":"0000:5e:00.0"},` +
		`"device":{"Requests":null,"PoolName":"","DeviceName":"","CDIDeviceIDs":null,"Metadata":{"Attributes":{"model":{"string":"H100"}},"NetworkData":null}}}}`
	groups := `[{"devices":[` + mig + `,` + vfio + `],"configState":{"mpsApplied":true,"timeSliceApplied":false}}]`
	want := `{"checksum":N,"v1":{"preparedClaims":{"u1":{"status":{},"preparedDevices":` + groups + `}}},` +
		`"v2":{"checksum":N,"preparedClaims":{` +
		`"u1":{"checkpointState":"PrepareCompleted","status":{},"preparedDevices":` + groups + `},` +
		`"u2":{"checkpointState":"PrepareStarted","status":{"reservedFor":[{"resource":"pods","name":"p","uid":"pod-1"}]},"name":"c","namespace":"ns"}},` +
		`"nodeBootID":"boot-1"}}`
	if got := masked(generate(t, mustFormat(t, "main"), in)); got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

// richInput holds what format f can hold: a completed claim with a GPU,
// a MIG device and (from v25.12) a vfio device, and (from v25.8) a started
// claim.
func richInput(f *format) string {
	mig := `{"kind":"mig","migUUID":"MIG-1","requests":["m"],"pool":"node-a","device":"gpu-1-mig-0","cdiDeviceIDs":["k8s.gpu.nvidia.com/claim=c1-gpu-1-mig-0"]`
	if f.caps.migConcrete {
		mig += `,"parentUUID":"GPU-2","parentMinor":1,"giId":7,"ciId":0`
	}
	devices := `{"kind":"gpu","uuid":"GPU-1","requests":["g"],"pool":"node-a","device":"gpu-0","cdiDeviceIDs":["k8s.gpu.nvidia.com/claim=c1-gpu-0"]},` + mig + `}`
	if f.caps.vfio {
		devices += `,{"kind":"vfio","uuid":"GPU-3","requests":["v"],"pool":"node-a","device":"gpu-2-vfio","cdiDeviceIDs":[]}`
	}
	claims := `{"uid":"c1","status":{"allocation":{"devices":{"results":[{"request":"g","driver":"gpu.nvidia.com","pool":"node-a","device":"gpu-0"}]}}},` +
		`"groups":[{"mpsControlDaemonID":"","devices":[` + devices + `]}]}`
	if f.caps.v2 {
		claims += `,{"uid":"c0","state":"PrepareStarted"}`
	}
	bootID := ""
	if f.caps.v04 {
		bootID = "3f5c1d2e-0000-4000-8000-000000000001"
	}
	return fmt.Sprintf(`{"bootID":%q,"claims":[%s]}`, bootID, claims)
}

func TestEachFormatVerifies(t *testing.T) {
	for _, f := range formats {
		out := generate(t, f, richInput(f))
		if err := f.verify(out); err != nil {
			t.Errorf("%s: %v\n%s", f.name, err, out)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(out, &top); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if _, ok := top["v2"]; ok != f.caps.v2 {
			t.Errorf("%s: has v2 = %v", f.name, ok)
		}
		// v1 holds the completed claim only.
		if f.caps.v2 && (!bytes.Contains(top["v1"], []byte(`"c1"`)) || bytes.Contains(top["v1"], []byte(`"c0"`))) {
			t.Errorf("%s: v1 is %s", f.name, top["v1"])
		}
	}
}

func TestAFlippedByteFailsVerify(t *testing.T) {
	for _, f := range formats {
		out := generate(t, f, richInput(f))
		flips := map[string]int{
			"a UUID in v1": bytes.Index(out, []byte(`"GPU-1"`)) + 5,
			"the checksum": bytes.Index(out, []byte(`"checksum":`)) + 12,
		}
		if f.caps.v2 {
			flips["a UUID in v2"] = bytes.LastIndex(out, []byte(`"GPU-1"`)) + 5
			flips["the v2 checksum"] = bytes.LastIndex(out, []byte(`"checksum":`)) + 12
		}
		for what, at := range flips {
			tampered := bytes.Clone(out)
			tampered[at] ^= 0x01 // '1' <-> '0', digits stay digits
			if !json.Valid(tampered) {
				t.Fatalf("%s: flipping %s made invalid JSON", f.name, what)
			}
			if err := f.verify(tampered); err == nil {
				t.Errorf("%s: flipping a byte of %s still verifies", f.name, what)
			}
		}
	}
}

// The checksum package is FNV-32a over the spew dump of the JSON bytes
// (hashutil.DeepHashObject), as every tag vendored it.
func TestChecksumIsFnv32aOfTheDump(t *testing.T) {
	out := generate(t, mustFormat(t, "v25.3"), oneGpu)
	zeroed := checksumRE.ReplaceAll(out, []byte(`"checksum":0`))
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(zeroed))
	want := fmt.Sprintf(`"checksum":%d`, h.Sum32())
	if got := checksumRE.Find(out); string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// What each release makes of the others' files (its VerifyChecksum on its
// own types).
func TestCrossFormatVerify(t *testing.T) {
	gpu := func(name string) []byte { return generate(t, mustFormat(t, name), oneGpu) }
	// Downgrade: v25.3 ignores "v2", and the top checksum was computed
	// without it.
	for _, newer := range []string{"v25.8", "v25.12", "v0.4", "v0.4.1"} {
		if err := mustFormat(t, "v25.3").verify(gpu(newer)); err != nil {
			t.Errorf("v25.3 rejects a %s file: %v", newer, err)
		}
	}
	// Upgrade through v0.4.1: same bytes when no new field is set.
	for _, older := range []string{"v25.3", "v25.8", "v25.12", "v0.4"} {
		if err := mustFormat(t, "v0.4.1").verify(gpu(older)); err != nil {
			t.Errorf("v0.4.1 rejects a %s file: %v", older, err)
		}
	}
	// main writes an MPS-less group as "configState":{}, so it rejects
	// every release's file holding one ...
	for _, older := range []string{"v25.3", "v25.8", "v25.12", "v0.4", "v0.4.1"} {
		if err := mustFormat(t, "main").verify(gpu(older)); err == nil {
			t.Errorf("main accepts a %s file with an MPS-less group", older)
		}
	}
	// ... but not one whose groups all have an MPS control daemon, nor one
	// without claims.
	withMps := strings.Replace(oneGpu, `"groups":[{`, `"groups":[{"mpsControlDaemonID":"mps-x",`, 1)
	if err := mustFormat(t, "main").verify(generate(t, mustFormat(t, "v0.4.1"), withMps)); err != nil {
		t.Errorf("main rejects a v0.4.1 file whose group has MPS: %v", err)
	}
	if err := mustFormat(t, "main").verify(generate(t, mustFormat(t, "v25.8"), `{"claims":[]}`)); err != nil {
		t.Errorf("main rejects an empty v25.8 file: %v", err)
	}
	// v25.12 does not know "nodeBootID": it drops it and the v2 checksum
	// fails.
	booted := generate(t, mustFormat(t, "v0.4"), `{"bootID":"b","claims":[]}`)
	if err := mustFormat(t, "v25.12").verify(booted); err == nil || !strings.Contains(err.Error(), "v2 checksum") {
		t.Errorf("v25.12 on a v0.4 file with a boot ID: %v", err)
	}
}

func TestFieldsAFormatCannotHold(t *testing.T) {
	for _, c := range []struct{ format, in, field string }{
		{"v25.3", `{"claims":[{"uid":"a","state":"PrepareStarted"}]}`, "claims[0].state"},
		{"v25.8", `{"claims":[{"uid":"a","name":"n"}]}`, "claims[0].name"},
		{"v25.12", `{"bootID":"b"}`, "bootID"},
		{"v25.8", `{"claims":[{"uid":"a","groups":[{"devices":[{"kind":"vfio","uuid":"GPU-1"}]}]}]}`, "claims[0].groups[0].devices[0].kind"},
		{"v25.8", `{"claims":[{"uid":"a","groups":[{"devices":[{"kind":"mig","migUUID":"M","giId":1}]}]}]}`, "claims[0].groups[0].devices[0].giId"},
		{"v25.12", `{"claims":[{"uid":"a","groups":[{"devices":[{"kind":"mig","migUUID":"M"}]}]}]}`, "claims[0].groups[0].devices[0].parentUUID"},
		{"v25.12", `{"claims":[{"uid":"a","groups":[{"devices":[{"kind":"gpu","uuid":"G","shareID":"s"}]}]}]}`, "claims[0].groups[0].devices[0].shareID"},
		{"v0.4", `{"claims":[{"uid":"a","groups":[{"timeSliceApplied":true}]}]}`, "claims[0].groups[0].timeSliceApplied"},
		{"v0.4.1", `{"claims":[{"uid":"a","groups":[{"mpsApplied":true}]}]}`, "claims[0].groups[0].mpsApplied"},
		{"main", `{"claims":[{"uid":"a"},{"uid":"a"}]}`, "claims[1].uid"},
		{"main", `{"claims":[{"uid":"a","groups":[{"devices":[{"kind":"gpu","uuid":"G","migUUID":"M"}]}]}]}`, "claims[0].groups[0].devices[0].migUUID"},
	} {
		var in input
		if err := decodeStrict([]byte(c.in), &in); err != nil {
			t.Fatal(err)
		}
		_, err := buildCheckpoint(mustFormat(t, c.format), &in)
		if err == nil || !strings.HasPrefix(err.Error(), c.field+":") {
			t.Errorf("%s %s: got %v, want an error naming %s", c.format, c.in, err, c.field)
		}
	}
}

func TestCdiYaml(t *testing.T) {
	spec := `{"kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"uid-1-gpu-0",
	 "containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"],"deviceNodes":[{"path":"/dev/nvidia0"}]}}],
	 "containerEdits":{"env":["A=1"]}}`
	for format, mode := range map[string]os.FileMode{"v25.3": 0o600, "v25.12": 0o644, "main": 0o644} {
		dir := t.TempDir()
		path := filepath.Join(dir, "k8s.gpu.nvidia.com-claim_uid-1.yaml")
		if err := writeCDIYAML(mustFormat(t, format), []byte(spec), path); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(data, []byte("---\ncdiVersion: ")) || !bytes.Contains(data, []byte("\nkind: k8s.gpu.nvidia.com/claim\n")) {
			t.Errorf("%s: %s", format, data)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", format, st.Mode().Perm(), mode)
		}
		read, err := cdi.ReadSpec(path, 0)
		if err != nil {
			t.Fatalf("%s: reading it back: %v", format, err)
		}
		if read.GetDevice("uid-1-gpu-0") == nil {
			t.Errorf("%s: no device uid-1-gpu-0 in %s", format, data)
		}
	}
	if err := writeCDIYAML(mustFormat(t, "main"), []byte(spec), filepath.Join(t.TempDir(), "x.json")); err == nil {
		t.Error("a .json path is accepted")
	}
}

func TestCli(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"checkpoint", "--format", "v25.3.1"}, strings.NewReader(oneGpu), &out); err != nil {
		t.Fatal(err)
	}
	cp := bytes.Clone(out.Bytes())
	out.Reset()
	if err := run([]string{"verify", "--format", "v25.3"}, bytes.NewReader(cp), &out); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"verify"}, bytes.NewReader(cp), &out); err == nil {
		t.Error("main verifies a v25.3 file with an MPS-less group")
	}
	out.Reset()
	if err := run([]string{"verify", "--format", "any"}, bytes.NewReader(cp), &out); err != nil || out.String() != "checksums verify as format v0.4.1\n" {
		t.Errorf("verify any: %v, %q", err, out.String())
	}
	cp[bytes.LastIndex(cp, []byte(`GPU-1`))+4] ^= 1
	if err := run([]string{"verify", "--format", "any"}, bytes.NewReader(cp), &out); err == nil {
		t.Error("verify any accepts a flipped byte")
	}
	if err := run([]string{"checkpoint"}, strings.NewReader(oneGpu), &out); err == nil {
		t.Error("checkpoint without --format")
	}
	if err := run([]string{"checkpoint", "--format", "v9"}, strings.NewReader(oneGpu), &out); err == nil {
		t.Error("an unknown format")
	}
}
