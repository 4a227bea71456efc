// Command go-allocator allocates ResourceClaims on a fleet of
// ResourceSlices with the kube-scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured), the way the scheduler
// runs it and the way `gpu-dra-controller simulate` runs ours: claims in
// input order, each with a new allocator over the allocations made so far
// (the scheduler's PreFilter), then Allocate on one node after the other in
// name order until one fits (its Filter), that node's result committed.
//
//	usage: go-allocator -classes FILE -slices FILE -claims FILE
//
// Each FILE is a `v1` List (`kubectl get ... -o json`), read one item at a
// time. Standard output: `{"results": [...]}`, one entry per claim, in the
// shape of `simulate -o json`. Standard error: a `timings:` line (read,
// allocate, output) and an `allocate calls:` line. Exit 1 on bad input.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// The allocator features of Kubernetes 1.36 with its default feature gates,
// the release our allocator follows: prioritized lists, admin access,
// device taints, partitionable devices, consumable capacity and binding
// conditions; list-type attributes (alpha) off.
var features = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

func main() {
	classesPath := flag.String("classes", "", "DeviceClasses, a v1 List in JSON")
	slicesPath := flag.String("slices", "", "ResourceSlices, a v1 List in JSON")
	claimsPath := flag.String("claims", "", "ResourceClaims, a v1 List in JSON, allocated in this order")
	flag.Parse()
	if *classesPath == "" || *slicesPath == "" || *claimsPath == "" {
		fail(errors.New("usage: go-allocator -classes FILE -slices FILE -claims FILE"))
	}
	if err := run(*classesPath, *slicesPath, *claimsPath, os.Stdout, os.Stderr); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "error: %v\n", err)
	os.Exit(1)
}

func run(classesPath, slicesPath, claimsPath string, out, note io.Writer) error {
	started := time.Now()
	classes := &classLister{byName: map[string]*resourceapi.DeviceClass{}}
	if err := readList(classesPath, func(c *resourceapi.DeviceClass) error {
		classes.all = append(classes.all, c)
		classes.byName[c.Name] = c
		return nil
	}); err != nil {
		return err
	}
	var slices []*resourceapi.ResourceSlice
	nodeNames := sets.New[string]()
	if err := readList(slicesPath, func(s *resourceapi.ResourceSlice) error {
		slices = append(slices, s)
		if s.Spec.NodeName != nil {
			nodeNames.Insert(*s.Spec.NodeName)
		}
		return nil
	}); err != nil {
		return err
	}
	var claims []*resourceapi.ResourceClaim
	if err := readList(claimsPath, func(c *resourceapi.ResourceClaim) error {
		setDefaults(c)
		claims = append(claims, c)
		return nil
	}); err != nil {
		return err
	}
	// Nodes in name order, as simulate tries them.
	var nodes []*v1.Node
	for _, name := range sets.List(nodeNames) {
		nodes = append(nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	read := time.Since(started)

	started = time.Now()
	results, calls := allocate(context.Background(), classes, slices, nodes, claims)
	allocateTime := time.Since(started)

	started = time.Now()
	w := bufio.NewWriterSize(out, 1<<16)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(document{Results: results}); err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	fmt.Fprintf(note, "timings: read %.1f ms, allocate %.1f ms, output %.1f ms (%d claims)\n",
		ms(read), ms(allocateTime), ms(time.Since(started)), len(claims))
	fmt.Fprintf(note, "allocate calls: %d (mean %.3f ms, max %.3f ms); %d slices, %d nodes; %s\n",
		calls.count, ms(calls.total)/float64(max(calls.count, 1)), ms(calls.longest), len(slices), len(nodes), draVersion())
	return nil
}

// setDefaults applies the apiserver's defaults for resource.k8s.io/v1
// claims, which the scheduler always sees applied (the allocator refuses
// an empty allocation mode): ExactCount with a count of 1, tolerations
// with operator Equal.
func setDefaults(c *resourceapi.ResourceClaim) {
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if e := r.Exactly; e != nil {
			e.AllocationMode, e.Count = defaultMode(e.AllocationMode, e.Count)
			defaultTolerations(e.Tolerations)
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			s.AllocationMode, s.Count = defaultMode(s.AllocationMode, s.Count)
			defaultTolerations(s.Tolerations)
		}
	}
}

func defaultMode(mode resourceapi.DeviceAllocationMode, count int64) (resourceapi.DeviceAllocationMode, int64) {
	if mode == "" {
		mode = resourceapi.DeviceAllocationModeExactCount
	}
	if mode == resourceapi.DeviceAllocationModeExactCount && count == 0 {
		count = 1
	}
	return mode, count
}

func defaultTolerations(tolerations []resourceapi.DeviceToleration) {
	for i := range tolerations {
		if tolerations[i].Operator == "" {
			tolerations[i].Operator = resourceapi.DeviceTolerationOpEqual
		}
	}
}

// calls counts the Allocate calls and their time.
type calls struct {
	count   int
	total   time.Duration
	longest time.Duration
}

// allocate places each claim on the first node that fits, each seeing the
// allocations before it.
func allocate(ctx context.Context, classes *classLister, slices []*resourceapi.ResourceSlice, nodes []*v1.Node,
	claims []*resourceapi.ResourceClaim) ([]result, calls) {
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	used := newInUse()
	results := make([]result, len(claims))
	for i, claim := range claims {
		results[i] = result{Namespace: claim.Namespace, Name: claim.Name}
		if claim.Status.Allocation != nil {
			used.add(claim.Status.Allocation)
			results[i].Allocated, results[i].Allocation = true, claim.Status.Allocation
		}
	}
	var stats calls
	for i, claim := range claims {
		if claim.Status.Allocation != nil {
			continue
		}
		r := &results[i]
		allocator, err := structured.NewAllocator(ctx, features, used.snapshot(), classes, slices, celCache)
		if err != nil {
			r.Error, r.Reason = true, err.Error()
			continue
		}
		r.Reason = fmt.Sprintf("cannot be allocated on any of %d nodes", len(nodes))
		for _, node := range nodes {
			started := time.Now()
			allocations, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			took := time.Since(started)
			stats.count++
			stats.total += took
			stats.longest = max(stats.longest, took)
			if errors.Is(err, structured.ErrFailedAllocationOnNode) {
				continue
			}
			if err != nil {
				// A fatal problem (a CEL error, an unknown class): the
				// scheduler stops trying other nodes.
				r.Error, r.Reason = true, err.Error()
				break
			}
			if len(allocations) == 1 {
				used.add(&allocations[0])
				r.Allocated, r.Node, r.Allocation, r.Reason = true, node.Name, &allocations[0], ""
				break
			}
		}
	}
	return results, stats
}

// inUse is what allocated claims hold, kept as the scheduler keeps it:
// dedicated devices, shares of devices and their consumed capacity
// (an admin-access result holds nothing).
type inUse struct {
	devices  sets.Set[structured.DeviceID]
	shares   sets.Set[structured.SharedDeviceID]
	capacity structured.ConsumedCapacityCollection
}

func newInUse() *inUse {
	return &inUse{
		devices:  sets.New[structured.DeviceID](),
		shares:   sets.New[structured.SharedDeviceID](),
		capacity: structured.NewConsumedCapacityCollection(),
	}
}

func (u *inUse) add(allocation *resourceapi.AllocationResult) {
	for _, r := range allocation.Devices.Results {
		if r.AdminAccess != nil && *r.AdminAccess {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID != nil {
			u.shares.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				u.capacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
			continue
		}
		u.devices.Insert(id)
	}
}

// snapshot is the state a new allocator gets: a copy, as the scheduler's
// PreFilter takes one.
func (u *inUse) snapshot() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         u.devices.Clone(),
		AllocatedSharedDeviceIDs: u.shares.Clone(),
		AggregatedCapacity:       u.capacity.Clone(),
	}
}

type classLister struct {
	all    []*resourceapi.DeviceClass
	byName map[string]*resourceapi.DeviceClass
}

func (l *classLister) List() ([]*resourceapi.DeviceClass, error) { return l.all, nil }

func (l *classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l.byName[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

// result is one claim's outcome, as `simulate -o json` prints it.
type result struct {
	Namespace  string                        `json:"namespace"`
	Name       string                        `json:"name"`
	Allocated  bool                          `json:"allocated"`
	Node       string                        `json:"node,omitempty"`
	Allocation *resourceapi.AllocationResult `json:"allocation"`
	Error      bool                          `json:"error"`
	Reason     string                        `json:"reason,omitempty"`
}

type document struct {
	Results []result `json:"results"`
}

// readList decodes the `items` of the List in path one at a time, so no
// more than one item's JSON is held beside the objects.
func readList[T any](path string, each func(*T) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	if err := expectDelim(dec, '{'); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	items := 0
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if key != "items" {
			var skipped json.RawMessage
			if err := dec.Decode(&skipped); err != nil {
				return fmt.Errorf("%s: %v: %w", path, key, err)
			}
			continue
		}
		if err := expectDelim(dec, '['); err != nil {
			return fmt.Errorf("%s: items: %w", path, err)
		}
		for dec.More() {
			item := new(T)
			if err := dec.Decode(item); err != nil {
				return fmt.Errorf("%s: items[%d]: %w", path, items, err)
			}
			if err := each(item); err != nil {
				return fmt.Errorf("%s: items[%d]: %w", path, items, err)
			}
			items++
		}
		if err := expectDelim(dec, ']'); err != nil {
			return fmt.Errorf("%s: items: %w", path, err)
		}
	}
	return expectDelim(dec, '}')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("found %v where %v was expected (a v1 List)", tok, want)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// draVersion names the allocator's module version, as built.
func draVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/dynamic-resource-allocation" {
				return dep.Path + " " + dep.Version
			}
		}
	}
	return "k8s.io/dynamic-resource-allocation (version unknown)"
}
