package main

// The checkpoint layouts of NVIDIA's gpu-kubelet-plugin, re-declared per
// format (see the table in main.go): the same Go field order and JSON tags
// as the release's own types, so that encoding/json writes the same bytes
// and, on verify, drops the same unknown keys the release's decoder drops.
// The composite types are generic over the parts that changed between
// releases; each format instantiates them once (see formats.go).

import (
	"encoding/json"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum"
	cperrors "k8s.io/kubernetes/pkg/kubelet/checkpointmanager/errors"
)

// deviceK8s134 is kubeletplugin.Device of k8s.io/dynamic-resource-allocation
// v0.34, vendored at v25.3.0 through v25.12.0
// (vendor/k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go):
// no JSON tags, so the Go field names are the keys.
type deviceK8s134 struct {
	Requests     []string
	PoolName     string
	DeviceName   string
	CDIDeviceIDs []string
}

// checkpointedDevice is CheckpointedDevice of v0.4.0 and later
// (checkpointv.go): kubeletplugin.Device of v0.36 (which added ShareID and
// Metadata) written through a MarshalJSON that makes the two new fields
// omitempty.
type checkpointedDevice struct {
	Requests     []string        `json:"Requests"`
	PoolName     string          `json:"PoolName"`
	DeviceName   string          `json:"DeviceName"`
	CDIDeviceIDs []string        `json:"CDIDeviceIDs"`
	ShareID      *types.UID      `json:"ShareID,omitempty"`
	Metadata     *deviceMetadata `json:"Metadata,omitempty"`
}

// deviceMetadata is kubeletplugin.DeviceMetadata (v0.36): no JSON tags.
type deviceMetadata struct {
	Attributes  map[string]resourceapi.DeviceAttribute
	NetworkData *resourceapi.NetworkDeviceData
}

// uuidOnly is what GpuInfo serializes to at every tag, MigDeviceInfo at
// v25.3.x and v25.8.x, and VfioDeviceInfo at v25.12.0 (deviceinfo.go: all
// other fields unexported).
type uuidOnly struct {
	UUID string `json:"uuid"`
}

// vfioInfoV04 is VfioDeviceInfo from v0.4.0 (deviceinfo.go).
type vfioInfoV04 struct {
	UUID     string `json:"uuid"`
	PciBusID string `json:"pciBusID,omitempty"`
}

// migLiveV2512 is MigLiveTuple at v25.12.0 (mig.go).
type migLiveV2512 struct {
	ParentMinor int    `json:"parentMinor"`
	GIID        int    `json:"giId"`
	CIID        int    `json:"ciId"`
	MigUUID     string `json:"migUUID"`
	ParentUUID  string `json:"parentUUID"`
}

// migLiveV04 is MigLiveTuple from v0.4.0 (mig.go).
type migLiveV04 struct {
	ParentMinor    int    `json:"parentMinor"`
	GIID           int    `json:"giId"`
	CIID           int    `json:"ciId"`
	MigUUID        string `json:"migUUID"`
	ParentUUID     string `json:"parentUUID"`
	ParentPCIBusID string `json:"parentPCIBusID,omitempty"`
}

// configV253 is DeviceConfigState at v25.3.0 through v0.4.0
// (device_state.go).
type configV253 struct {
	MpsControlDaemonID string `json:"mpsControlDaemonID"`
}

// configV041 is DeviceConfigState at v0.4.1.
type configV041 struct {
	MpsControlDaemonID string `json:"mpsControlDaemonID"`
	TimeSliceApplied   *bool  `json:"timeSliceApplied,omitempty"`
}

// configMain is DeviceConfigState on main after v0.4.1 (commit 75a2d69f,
// consumable shares).
type configMain struct {
	MpsControlDaemonID string `json:"mpsControlDaemonID,omitempty"`
	MpsApplied         *bool  `json:"mpsApplied,omitempty"`
	TimeSliceApplied   *bool  `json:"timeSliceApplied,omitempty"`
}

// withInfo is PreparedGpu (every tag), PreparedMigDevice (v25.3.x,
// v25.8.x) and PreparedVfioDevice (v25.12.0 on) (prepared.go).
type withInfo[I, D any] struct {
	Info   *I `json:"info"`
	Device *D `json:"device"`
}

// withConcrete is PreparedMigDevice from v25.12.0 (prepared.go).
type withConcrete[M, D any] struct {
	Concrete *M `json:"concrete"`
	Device   *D `json:"device"`
}

// preparedGpuMig is PreparedDevice at v25.3.x and v25.8.x.
type preparedGpuMig struct {
	Gpu *withInfo[uuidOnly, deviceK8s134] `json:"gpu"`
	Mig *withInfo[uuidOnly, deviceK8s134] `json:"mig"`
}

// preparedGpuMigVfio is PreparedDevice from v25.12.0.
type preparedGpuMigVfio[M, V, D any] struct {
	Gpu  *withInfo[uuidOnly, D] `json:"gpu"`
	Mig  *withConcrete[M, D]    `json:"mig"`
	Vfio *withInfo[V, D]        `json:"vfio,omitempty"`
}

// deviceGroup is PreparedDeviceGroup (prepared.go, every tag).
type deviceGroup[P, C any] struct {
	Devices     []P `json:"devices"`
	ConfigState C   `json:"configState"`
}

// claimV1 is PreparedClaim of v25.3.x (checkpoint.go) and PreparedClaimV1
// from v25.8.0 (checkpointv.go). `omitempty` on a struct has no effect:
// "status" is always written.
type claimV1[G any] struct {
	Status          resourceapi.ResourceClaimStatus `json:"status,omitempty"`
	PreparedDevices []*G                            `json:"preparedDevices,omitempty"`
}

type sectionV1[G any] struct {
	PreparedClaims map[string]claimV1[G] `json:"preparedClaims,omitempty"`
}

// claimV2V258 is PreparedClaimV2 at v25.8.x.
type claimV2V258[G any] struct {
	CheckpointState string                          `json:"checkpointState"`
	Status          resourceapi.ResourceClaimStatus `json:"status,omitempty"`
	PreparedDevices []*G                            `json:"preparedDevices,omitempty"`
}

// claimV2V2512 is PreparedClaimV2 from v25.12.0.
type claimV2V2512[G any] struct {
	CheckpointState string                          `json:"checkpointState"`
	Status          resourceapi.ResourceClaimStatus `json:"status,omitempty"`
	PreparedDevices []*G                            `json:"preparedDevices,omitempty"`
	Name            string                          `json:"name,omitempty"`
	Namespace       string                          `json:"namespace,omitempty"`
}

// sectionV2V258 is CheckpointV2 at v25.8.x.
type sectionV2V258[G any] struct {
	Checksum       checksum.Checksum         `json:"checksum"`
	PreparedClaims map[string]claimV2V258[G] `json:"preparedClaims,omitempty"`
}

// sectionV2V2512 is CheckpointV2 at v25.12.0.
type sectionV2V2512[G any] struct {
	Checksum       checksum.Checksum          `json:"checksum"`
	PreparedClaims map[string]claimV2V2512[G] `json:"preparedClaims,omitempty"`
}

// sectionV2V04 is CheckpointV2 from v0.4.0.
type sectionV2V04[G any] struct {
	Checksum       checksum.Checksum          `json:"checksum"`
	PreparedClaims map[string]claimV2V2512[G] `json:"preparedClaims,omitempty"`
	NodeBootID     string                     `json:"nodeBootID,omitempty"`
}

func (s *sectionV2V258[G]) sum() *checksum.Checksum  { return &s.Checksum }
func (s *sectionV2V2512[G]) sum() *checksum.Checksum { return &s.Checksum }
func (s *sectionV2V04[G]) sum() *checksum.Checksum   { return &s.Checksum }

// v2Section is a CheckpointV2 layout: its embedded checksum.
type v2Section[S any] interface {
	*S
	sum() *checksum.Checksum
}

// fileV1 is Checkpoint at v25.3.x (checkpoint.go).
type fileV1[G any] struct {
	Checksum checksum.Checksum `json:"checksum"`
	V1       *sectionV1[G]     `json:"v1,omitempty"`
}

// fileV1V2 is Checkpoint from v25.8.0 (checkpoint.go): the top checksum
// covers the file without "v2"; "v2" carries its own.
type fileV1V2[G, S any] struct {
	Checksum checksum.Checksum `json:"checksum"`
	V1       *sectionV1[G]     `json:"v1,omitempty"`
	V2       *S                `json:"v2,omitempty"`
}

// marshalV1 is MarshalCheckpoint of v25.3.x: the checksum of the file
// written with checksum 0, then the file.
func marshalV1[G any](cp *fileV1[G]) ([]byte, error) {
	cp.Checksum = 0
	out, err := json.Marshal(*cp)
	if err != nil {
		return nil, err
	}
	cp.Checksum = checksum.New(out)
	return json.Marshal(*cp)
}

// verifyV1 is VerifyChecksum of v25.3.x, after UnmarshalCheckpoint.
func verifyV1[G any](data []byte) error {
	var cp fileV1[G]
	if err := json.Unmarshal(data, &cp); err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	ck := cp.Checksum
	cp.Checksum = 0
	out, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := ck.Verify(out); err != nil {
		return mismatch("checksum", err)
	}
	return nil
}

// marshalV1V2 is MarshalCheckpoint from v25.8.0 on a checkpoint whose V1 is
// already ToV1 of its V2: the v1 checksum over the file without "v2" and
// with checksum 0 (SetChecksumV1), the v2 checksum over "v2" alone with its
// checksum 0 (SetChecksumV2), then the whole file.
func marshalV1V2[G, S any, PS v2Section[S]](cp *fileV1V2[G, S]) ([]byte, error) {
	v2 := cp.V2
	cp.V2 = nil
	cp.Checksum = 0
	out, err := json.Marshal(*cp)
	cp.V2 = v2
	if err != nil {
		return nil, err
	}
	cp.Checksum = checksum.New(out)

	sum := PS(cp.V2).sum()
	*sum = 0
	out, err = json.Marshal(*cp.V2)
	if err != nil {
		return nil, err
	}
	*sum = checksum.New(out)
	return json.Marshal(*cp)
}

// verifyV1V2 is VerifyChecksum from v25.8.0 (VerifyChecksumV1, then
// VerifyChecksumV2 if there is a "v2"), after UnmarshalCheckpoint.
func verifyV1V2[G, S any, PS v2Section[S]](data []byte) error {
	var cp fileV1V2[G, S]
	if err := json.Unmarshal(data, &cp); err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	v2 := cp.V2
	ck := cp.Checksum
	cp.V2 = nil
	cp.Checksum = 0
	out, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := ck.Verify(out); err != nil {
		return mismatch("v1 checksum", err)
	}
	if v2 == nil {
		return nil
	}
	sum := PS(v2).sum()
	ck = *sum
	*sum = 0
	out, err = json.Marshal(*v2)
	if err != nil {
		return err
	}
	if err := ck.Verify(out); err != nil {
		return mismatch("v2 checksum", err)
	}
	return nil
}

// mismatch names which checksum failed, with both values.
func mismatch(which string, err error) error {
	var corrupt *cperrors.CorruptCheckpointError
	if errors.As(err, &corrupt) {
		return fmt.Errorf("%s: %w (the file says %d, its contents hash to %d)", which, err, corrupt.ExpectedCS, corrupt.ActualCS)
	}
	return fmt.Errorf("%s: %w", which, err)
}
