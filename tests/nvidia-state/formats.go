package main

// The formats (table in main.go): what each can hold, and its checkpoint
// types instantiated from layouts.go.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	statePrepareStarted   = "PrepareStarted"
	statePrepareCompleted = "PrepareCompleted"
)

// The checkpoint input (stdin of `checkpoint`); see main.go.
type input struct {
	BootID string    `json:"bootID"`
	Claims []inClaim `json:"claims"`
}

type inClaim struct {
	UID       string          `json:"uid"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	State     string          `json:"state"`
	Status    json.RawMessage `json:"status"`
	Groups    []inGroup       `json:"groups"`

	status resourceapi.ResourceClaimStatus
}

type inGroup struct {
	MpsControlDaemonID string     `json:"mpsControlDaemonID"`
	TimeSliceApplied   *bool      `json:"timeSliceApplied"`
	MpsApplied         *bool      `json:"mpsApplied"`
	Devices            []inDevice `json:"devices"`
}

type inDevice struct {
	Kind string `json:"kind"`
	// gpu and vfio
	UUID string `json:"uuid"`
	// vfio
	PciBusID string `json:"pciBusID"`
	// mig
	MigUUID        string `json:"migUUID"`
	ParentUUID     string `json:"parentUUID"`
	ParentMinor    *int   `json:"parentMinor"`
	GIID           *int   `json:"giId"`
	CIID           *int   `json:"ciId"`
	ParentPCIBusID string `json:"parentPCIBusID"`
	// kubeletplugin.Device
	Requests     []string        `json:"requests"`
	Pool         string          `json:"pool"`
	Device       string          `json:"device"`
	CDIDeviceIDs []string        `json:"cdiDeviceIDs"`
	ShareID      *string         `json:"shareID"`
	Metadata     json.RawMessage `json:"metadata"`

	metadata *deviceMetadata
}

// caps is what a format can hold beyond the v25.3 layout.
type caps struct {
	v2          bool // "v2" section with its own checksum, claim states
	claimNames  bool // v2 claims' name and namespace
	migConcrete bool // MIG devices as MigLiveTuple (else their UUID only)
	vfio        bool // vfio devices
	v04         bool // nodeBootID, ShareID, Metadata, parentPCIBusID, vfio pciBusID
	timeSlice   bool // configState.timeSliceApplied
	mpsApplied  bool // configState.mpsApplied
}

type format struct {
	name     string
	releases string
	caps     caps
	// specSave: claim CDI specs are written by nvcdi's spec.Save, which
	// chmods them 0644 (cdi.go writeSpec, from v25.12.0); before, by the
	// CDI cache's WriteSpec alone, which leaves its temporary file's 0600.
	specSave bool
	marshal  func(in *input, claims []*inClaim) ([]byte, error)
	verify   func(data []byte) error
}

// The instantiated layouts.
type (
	groupV253  = deviceGroup[preparedGpuMig, configV253]
	devV2512   = preparedGpuMigVfio[migLiveV2512, uuidOnly, deviceK8s134]
	groupV2512 = deviceGroup[devV2512, configV253]
	devV04     = preparedGpuMigVfio[migLiveV04, vfioInfoV04, checkpointedDevice]
)

var formats = []*format{
	{
		name:     "v25.3",
		releases: "v25.3.0 v25.3.1 v25.3.2",
		marshal: func(in *input, claims []*inClaim) ([]byte, error) {
			return marshalV1(&fileV1[groupV253]{V1: v1Of(claims, groupsOf(claims, groupGpuMig))})
		},
		verify: verifyV1[groupV253],
	},
	{
		name:     "v25.8",
		releases: "v25.8.0 v25.8.1",
		caps:     caps{v2: true},
		marshal: func(in *input, claims []*inClaim) ([]byte, error) {
			groups := groupsOf(claims, groupGpuMig)
			v2 := &sectionV2V258[groupV253]{PreparedClaims: map[string]claimV2V258[groupV253]{}}
			for i, c := range claims {
				v2.PreparedClaims[c.UID] = claimV2V258[groupV253]{CheckpointState: c.State, Status: c.status, PreparedDevices: groups[i]}
			}
			return marshalV1V2(&fileV1V2[groupV253, sectionV2V258[groupV253]]{V1: v1Of(claims, groups), V2: v2})
		},
		verify: verifyV1V2[groupV253, sectionV2V258[groupV253]],
	},
	{
		name:     "v25.12",
		specSave: true,
		releases: "v25.12.0",
		caps:     caps{v2: true, claimNames: true, migConcrete: true, vfio: true},
		marshal: func(in *input, claims []*inClaim) ([]byte, error) {
			groups := groupsOf(claims, groupConcrete(migV2512, vfioV2512, deviceK134, cfgV253))
			v2 := &sectionV2V2512[groupV2512]{PreparedClaims: claimsV2512(claims, groups)}
			return marshalV1V2(&fileV1V2[groupV2512, sectionV2V2512[groupV2512]]{V1: v1Of(claims, groups), V2: v2})
		},
		verify: verifyV1V2[groupV2512, sectionV2V2512[groupV2512]],
	},
	v04Format("v0.4", "v0.4.0", caps{v2: true, claimNames: true, migConcrete: true, vfio: true, v04: true}, cfgV253),
	v04Format("v0.4.1", "v0.4.1",
		caps{v2: true, claimNames: true, migConcrete: true, vfio: true, v04: true, timeSlice: true}, cfgV041),
	v04Format("main", "main at 95932046 (unreleased)",
		caps{v2: true, claimNames: true, migConcrete: true, vfio: true, v04: true, timeSlice: true, mpsApplied: true}, cfgMain),
}

// v04Format is a format of the v0.4 line, which differ only in the group
// config they write (cfg): concrete MIG and VFIO devices with their
// checkpointed device, the v0.4 layout, the spec saved by spec.Save.
func v04Format[C any](name, releases string, c caps, cfg func(*inGroup) C) *format {
	return &format{
		name:     name,
		specSave: true,
		releases: releases,
		caps:     c,
		marshal: func(in *input, claims []*inClaim) ([]byte, error) {
			return marshalV04(in, claims, groupsOf(claims, groupConcrete(migV04, vfioV04, checkpointed, cfg)))
		},
		verify: verifyV1V2[deviceGroup[devV04, C], sectionV2V04[deviceGroup[devV04, C]]],
	}
}

// formatAliases maps release tags to their format.
var formatAliases = map[string]string{
	"v25.3.0": "v25.3", "v25.3.1": "v25.3", "v25.3.2": "v25.3",
	"v25.8.0": "v25.8", "v25.8.1": "v25.8",
	"v25.12.0": "v25.12",
	"v0.4.0":   "v0.4",
	"head":     "main", "HEAD": "main",
}

func lookupFormat(name string) (*format, error) {
	if alias, ok := formatAliases[name]; ok {
		name = alias
	}
	var names []string
	for _, f := range formats {
		if f.name == name {
			return f, nil
		}
		names = append(names, f.name)
	}
	return nil, fmt.Errorf("unknown format %q (formats: %s; release tags are accepted too)", name, strings.Join(names, ", "))
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing
// data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// buildCheckpoint checks `in` against what format f can hold and writes the
// checkpoint file's bytes.
func buildCheckpoint(f *format, in *input) ([]byte, error) {
	claims, err := check(f, in)
	if err != nil {
		return nil, err
	}
	return f.marshal(in, claims)
}

// check validates the input for format f, decodes the embedded API
// objects, and returns the claims (with defaults applied).
func check(f *format, in *input) ([]*inClaim, error) {
	notHeld := func(path, why string) error {
		return fmt.Errorf("%s: format %s (%s) cannot hold it: %s", path, f.name, f.releases, why)
	}
	if in.BootID != "" && !f.caps.v04 {
		return nil, notHeld("bootID", "nodeBootID came with v0.4.0")
	}
	seen := map[string]bool{}
	var claims []*inClaim
	for i := range in.Claims {
		c := &in.Claims[i]
		p := fmt.Sprintf("claims[%d]", i)
		if c.UID == "" {
			return nil, fmt.Errorf("%s.uid: required", p)
		}
		if seen[c.UID] {
			return nil, fmt.Errorf("%s.uid: %q appears twice", p, c.UID)
		}
		seen[c.UID] = true
		switch c.State {
		case "":
			c.State = statePrepareCompleted
		case statePrepareCompleted:
		case statePrepareStarted:
			if !f.caps.v2 {
				return nil, notHeld(p+".state", "v25.3 checkpoints only completed claims; PrepareStarted came with v25.8.0")
			}
		default:
			return nil, fmt.Errorf("%s.state: %q is neither %s nor %s", p, c.State, statePrepareCompleted, statePrepareStarted)
		}
		if (c.Name != "" || c.Namespace != "") && !f.caps.claimNames {
			field := ".name"
			if c.Name == "" {
				field = ".namespace"
			}
			return nil, notHeld(p+field, "claim name and namespace came with v25.12.0")
		}
		if len(c.Status) > 0 && string(c.Status) != "null" {
			if err := decodeStrict(c.Status, &c.status); err != nil {
				return nil, fmt.Errorf("%s.status: not a resource.k8s.io/v1 ResourceClaimStatus: %w", p, err)
			}
		}
		for j := range c.Groups {
			g := &c.Groups[j]
			gp := fmt.Sprintf("%s.groups[%d]", p, j)
			if g.TimeSliceApplied != nil && !f.caps.timeSlice {
				return nil, notHeld(gp+".timeSliceApplied", "configState.timeSliceApplied came with v0.4.1")
			}
			if g.MpsApplied != nil && !f.caps.mpsApplied {
				return nil, notHeld(gp+".mpsApplied", "configState.mpsApplied is on main after v0.4.1 only")
			}
			for k := range g.Devices {
				if err := checkDevice(f, &g.Devices[k], fmt.Sprintf("%s.devices[%d]", gp, k), notHeld); err != nil {
					return nil, err
				}
			}
		}
		claims = append(claims, c)
	}
	return claims, nil
}

func checkDevice(f *format, d *inDevice, p string, notHeld func(path, why string) error) error {
	// Fields set that this kind of device does not have.
	var foreign []string
	set := func(name string, isSet bool) {
		if isSet {
			foreign = append(foreign, name)
		}
	}
	// The MIG device's fields, foreign to GPUs and VFIO devices.
	migFieldsSet := func() {
		set("migUUID", d.MigUUID != "")
		set("parentUUID", d.ParentUUID != "")
		set("parentMinor", d.ParentMinor != nil)
		set("giId", d.GIID != nil)
		set("ciId", d.CIID != nil)
		set("parentPCIBusID", d.ParentPCIBusID != "")
	}
	switch d.Kind {
	case "gpu":
		if d.UUID == "" {
			return fmt.Errorf("%s.uuid: required for a gpu", p)
		}
		set("pciBusID", d.PciBusID != "")
		migFieldsSet()
	case "vfio":
		if !f.caps.vfio {
			return notHeld(p+".kind", "vfio devices came with v25.12.0")
		}
		if d.UUID == "" {
			return fmt.Errorf("%s.uuid: required for a vfio device", p)
		}
		if d.PciBusID != "" && !f.caps.v04 {
			return notHeld(p+".pciBusID", "VfioDeviceInfo.pciBusID came with v0.4.0")
		}
		migFieldsSet()
	case "mig":
		if d.MigUUID == "" {
			return fmt.Errorf("%s.migUUID: required for a mig device", p)
		}
		set("uuid", d.UUID != "")
		set("pciBusID", d.PciBusID != "")
		if f.caps.migConcrete {
			for _, c := range []struct {
				name    string
				missing bool
			}{
				{"parentUUID", d.ParentUUID == ""}, {"parentMinor", d.ParentMinor == nil},
				{"giId", d.GIID == nil}, {"ciId", d.CIID == nil},
			} {
				if c.missing {
					return fmt.Errorf("%s.%s: required for a mig device in format %s (MigLiveTuple)", p, c.name, f.name)
				}
			}
			if d.ParentPCIBusID != "" && !f.caps.v04 {
				return notHeld(p+".parentPCIBusID", "MigLiveTuple.parentPCIBusID came with v0.4.0")
			}
		} else {
			for _, c := range []struct {
				name  string
				isSet bool
			}{
				{"parentUUID", d.ParentUUID != ""}, {"parentMinor", d.ParentMinor != nil},
				{"giId", d.GIID != nil}, {"ciId", d.CIID != nil}, {"parentPCIBusID", d.ParentPCIBusID != ""},
			} {
				if c.isSet {
					return notHeld(p+"."+c.name, "a MIG device is recorded by its UUID only before v25.12.0")
				}
			}
		}
	case "":
		return fmt.Errorf("%s.kind: required (gpu, mig or vfio)", p)
	default:
		return fmt.Errorf("%s.kind: %q is not gpu, mig or vfio", p, d.Kind)
	}
	if len(foreign) > 0 {
		sort.Strings(foreign)
		return fmt.Errorf("%s.%s: not a field of a %s device", p, foreign[0], d.Kind)
	}
	if d.ShareID != nil && !f.caps.v04 {
		return notHeld(p+".shareID", "the device's ShareID came with v0.4.0")
	}
	if len(d.Metadata) > 0 && string(d.Metadata) != "null" {
		if !f.caps.v04 {
			return notHeld(p+".metadata", "the device's Metadata came with v0.4.0")
		}
		d.metadata = &deviceMetadata{}
		if err := decodeStrict(d.Metadata, d.metadata); err != nil {
			return fmt.Errorf("%s.metadata: not a kubeletplugin.DeviceMetadata: %w", p, err)
		}
	}
	return nil
}

// groupsOf converts every claim's groups with `group`, in input order;
// like the plugin's append loop, no groups (or no devices) stay nil.
func groupsOf[G any](claims []*inClaim, group func(*inGroup) *G) [][]*G {
	out := make([][]*G, len(claims))
	for i, c := range claims {
		for j := range c.Groups {
			out[i] = append(out[i], group(&c.Groups[j]))
		}
	}
	return out
}

// v1Of is ToV1 (checkpointv.go; at v25.3.x the only section): the completed
// claims.
func v1Of[G any](claims []*inClaim, groups [][]*G) *sectionV1[G] {
	v1 := &sectionV1[G]{PreparedClaims: map[string]claimV1[G]{}}
	for i, c := range claims {
		if c.State != statePrepareCompleted {
			continue
		}
		v1.PreparedClaims[c.UID] = claimV1[G]{Status: c.status, PreparedDevices: groups[i]}
	}
	return v1
}

func claimsV2512[G any](claims []*inClaim, groups [][]*G) map[string]claimV2V2512[G] {
	out := map[string]claimV2V2512[G]{}
	for i, c := range claims {
		out[c.UID] = claimV2V2512[G]{
			CheckpointState: c.State, Status: c.status, PreparedDevices: groups[i],
			Name: c.Name, Namespace: c.Namespace,
		}
	}
	return out
}

func marshalV04[G any](in *input, claims []*inClaim, groups [][]*G) ([]byte, error) {
	v2 := &sectionV2V04[G]{PreparedClaims: claimsV2512(claims, groups), NodeBootID: in.BootID}
	return marshalV1V2(&fileV1V2[G, sectionV2V04[G]]{V1: v1Of(claims, groups), V2: v2})
}

// Device conversions.

func deviceK134(d *inDevice) *deviceK8s134 {
	return &deviceK8s134{Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs}
}

func checkpointed(d *inDevice) *checkpointedDevice {
	c := &checkpointedDevice{Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs, Metadata: d.metadata}
	if d.ShareID != nil {
		id := types.UID(*d.ShareID)
		c.ShareID = &id
	}
	return c
}

func groupGpuMig(g *inGroup) *groupV253 {
	out := &groupV253{ConfigState: configV253{MpsControlDaemonID: g.MpsControlDaemonID}}
	for i := range g.Devices {
		d := &g.Devices[i]
		var p preparedGpuMig
		switch d.Kind {
		case "gpu":
			p.Gpu = &withInfo[uuidOnly, deviceK8s134]{Info: &uuidOnly{UUID: d.UUID}, Device: deviceK134(d)}
		case "mig":
			p.Mig = &withInfo[uuidOnly, deviceK8s134]{Info: &uuidOnly{UUID: d.MigUUID}, Device: deviceK134(d)}
		}
		out.Devices = append(out.Devices, p)
	}
	return out
}

func groupConcrete[M, V, D, C any](
	mig func(*inDevice) *M, vfio func(*inDevice) *V, dev func(*inDevice) *D, cfg func(*inGroup) C,
) func(*inGroup) *deviceGroup[preparedGpuMigVfio[M, V, D], C] {
	return func(g *inGroup) *deviceGroup[preparedGpuMigVfio[M, V, D], C] {
		out := &deviceGroup[preparedGpuMigVfio[M, V, D], C]{ConfigState: cfg(g)}
		for i := range g.Devices {
			d := &g.Devices[i]
			var p preparedGpuMigVfio[M, V, D]
			switch d.Kind {
			case "gpu":
				p.Gpu = &withInfo[uuidOnly, D]{Info: &uuidOnly{UUID: d.UUID}, Device: dev(d)}
			case "mig":
				p.Mig = &withConcrete[M, D]{Concrete: mig(d), Device: dev(d)}
			case "vfio":
				p.Vfio = &withInfo[V, D]{Info: vfio(d), Device: dev(d)}
			}
			out.Devices = append(out.Devices, p)
		}
		return out
	}
}

func migV2512(d *inDevice) *migLiveV2512 {
	return &migLiveV2512{ParentMinor: *d.ParentMinor, GIID: *d.GIID, CIID: *d.CIID, MigUUID: d.MigUUID, ParentUUID: d.ParentUUID}
}

func migV04(d *inDevice) *migLiveV04 {
	return &migLiveV04{
		ParentMinor: *d.ParentMinor, GIID: *d.GIID, CIID: *d.CIID, MigUUID: d.MigUUID, ParentUUID: d.ParentUUID,
		ParentPCIBusID: d.ParentPCIBusID,
	}
}

func vfioV2512(d *inDevice) *uuidOnly { return &uuidOnly{UUID: d.UUID} }

func vfioV04(d *inDevice) *vfioInfoV04 { return &vfioInfoV04{UUID: d.UUID, PciBusID: d.PciBusID} }

func cfgV253(g *inGroup) configV253 { return configV253{MpsControlDaemonID: g.MpsControlDaemonID} }

func cfgV041(g *inGroup) configV041 {
	return configV041{MpsControlDaemonID: g.MpsControlDaemonID, TimeSliceApplied: g.TimeSliceApplied}
}

func cfgMain(g *inGroup) configMain {
	return configMain{MpsControlDaemonID: g.MpsControlDaemonID, MpsApplied: g.MpsApplied, TimeSliceApplied: g.TimeSliceApplied}
}
