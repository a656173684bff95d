package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6"
)

// updateScaleSet is PATCH {vmss}: tags, sku.capacity and the model's image,
// under If-Match. It answers 200 with the scale set (Updating) and the
// operation in Azure-AsyncOperation.
func (s *server) updateScaleSet(w http.ResponseWriter, r *http.Request) error {
	var req armcompute.VirtualMachineScaleSetUpdate
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, err := s.lookupScaleSet(r)
	if err != nil {
		return err
	}
	if err := checkIfMatch(r, set); err != nil {
		return err
	}
	capacity, err := requestedCapacity(set, &req)
	if err != nil {
		return err
	}
	if s.applyUpdate(set, &req, capacity, now) {
		set.version++
	}
	o := s.newOperation(set, now)
	s.lroHeaders(w, r, o, false)
	writeJSON(w, http.StatusOK, s.scaleSetView(set, now))
	return nil
}

// checkIfMatch fails unless If-Match is absent, "*" or the scale set's etag
// (quoted or not; a weak W/ prefix is ignored).
func checkIfMatch(r *http.Request, set *scaleSet) error {
	sent := r.Header.Get("If-Match")
	if sent == "" || sent == "*" {
		return nil
	}
	if strings.Trim(strings.TrimPrefix(sent, "W/"), `"`) != strconv.Itoa(set.version) {
		return errPreconditionFailed(sent, set.etag())
	}
	return nil
}

// requestedCapacity is the PATCH's sku.capacity, or the current one.
func requestedCapacity(set *scaleSet, req *armcompute.VirtualMachineScaleSetUpdate) (int64, error) {
	if req.SKU == nil || req.SKU.Capacity == nil {
		return set.capacity, nil
	}
	if c := *req.SKU.Capacity; c < 0 {
		return 0, errInvalidParameter("sku.capacity", "The capacity %d is not valid; it must not be negative.", c)
	}
	return *req.SKU.Capacity, nil
}

// applyUpdate applies a checked PATCH (the image before the capacity, so
// that VMs the same PATCH adds have the new image) and says whether anything
// changed.
func (s *server) applyUpdate(set *scaleSet, req *armcompute.VirtualMachineScaleSetUpdate, capacity int64, now time.Time) bool {
	changed := false
	if req.Tags != nil && !maps.EqualFunc(req.Tags, set.tags, equalPtr) {
		set.tags, changed = maps.Clone(req.Tags), true
	}
	if img := updatedImage(req); img != nil && !sameImage(img, set.image) {
		set.image, changed = cloneImage(img), true
		for _, v := range set.vms {
			v.latestModel = false
		}
	}
	if capacity != set.capacity {
		s.resize(set, capacity, now)
		changed = true
	}
	return changed
}

func updatedImage(req *armcompute.VirtualMachineScaleSetUpdate) *armcompute.ImageReference {
	if p := req.Properties; p != nil && p.VirtualMachineProfile != nil && p.VirtualMachineProfile.StorageProfile != nil {
		return p.VirtualMachineProfile.StorageProfile.ImageReference
	}
	return nil
}

func equalPtr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// sameImage compares two image references by their JSON.
func sameImage(a, b *armcompute.ImageReference) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// resize grows the scale set by new VMs (new instance ids), or shrinks it by
// deleting the VMs with the highest instance ids that are not deleting yet.
func (s *server) resize(set *scaleSet, capacity int64, now time.Time) {
	for range capacity - set.capacity {
		set.addVM(now)
	}
	live := set.liveVMs()
	for i := int64(0); i < set.capacity-capacity && i < int64(len(live)); i++ {
		live[len(live)-1-int(i)].deleting = now
	}
	set.capacity = capacity
}

// deleteInstances is POST {vmss}/delete: the named members go Deleting and the
// capacity drops by as many; one that is not a member fails the whole call.
// It answers 202 with the operation in Location and Azure-AsyncOperation.
func (s *server) deleteInstances(w http.ResponseWriter, r *http.Request) error {
	var req armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, err := s.lookupScaleSet(r)
	if err != nil {
		return err
	}
	members, err := set.members(req.InstanceIDs)
	if err != nil {
		return err
	}
	if n := startDeleting(members, now); n > 0 {
		set.capacity = max(0, set.capacity-n)
		set.version++
	}
	o := s.newOperation(set, now)
	s.lroHeaders(w, r, o, true)
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// members are the VMs the instance ids name (each once), or a 404 NotFound
// naming the ids that are not members.
func (set *scaleSet) members(ids []*string) ([]*vm, error) {
	if len(ids) == 0 {
		return nil, errInvalidParameter("instanceIds", "Required parameter 'instanceIds' is missing (null).")
	}
	var found []*vm
	var missing []string
	for _, id := range ids {
		v := set.vmByInstanceID(deref(id))
		switch {
		case v == nil:
			missing = append(missing, deref(id))
		case !slices.Contains(found, v):
			found = append(found, v)
		}
	}
	if len(missing) > 0 {
		return nil, errNotFound("The instance ids [%s] are not members of the scale set '%s'.",
			strings.Join(missing, ", "), set.name)
	}
	return found, nil
}

// startDeleting marks the VMs Deleting (those already so stay as they are) and
// counts the ones it marked.
func startDeleting(vms []*vm, now time.Time) int64 {
	var n int64
	for _, v := range vms {
		if v.deleting.IsZero() {
			v.deleting = now
			n++
		}
	}
	return n
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
