package main

import (
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6"
)

// scaleSet is a virtual machine scale set. Its capacity is stored, not
// counted: a VM that vanishes (/fake/vms/.../delete) leaves it unchanged.
type scaleSet struct {
	sub, rg, name string
	location      string
	uniqueID      string
	created       time.Time
	tags          map[string]*string
	skuName       *string
	skuTier       *string
	capacity      int64
	mode          armcompute.OrchestrationMode
	prefix        string                     // computerNamePrefix
	image         *armcompute.ImageReference // the model's image
	version       int                        // the etag; grows on every change
	nextID        int                        // the next instance id; never reused
	busyUntil     time.Time                  // the end of its last operation
	vms           map[int]*vm                // by instance id
}

func (set *scaleSet) id() string   { return scaleSetID(set.sub, set.rg, set.name) }
func (set *scaleSet) etag() string { return `"` + strconv.Itoa(set.version) + `"` }

// createScaleSet is PUT {vmss}: a new scale set with sku.capacity VMs. It is
// there at once (no operation); a second PUT of the name is a conflict.
func (s *server) createScaleSet(w http.ResponseWriter, r *http.Request) error {
	var req armcompute.VirtualMachineScaleSet
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	name := r.PathValue("vmss")
	if old := s.sets[strings.ToLower(name)]; old != nil {
		return errConflict("The scale set '%s' exists already (as %s); the fake does not update by PUT.", name, old.id())
	}
	set, err := newScaleSet(r, &req, now)
	if err != nil {
		return err
	}
	for range set.capacity {
		set.addVM(now)
	}
	s.sets[strings.ToLower(name)] = set
	writeJSON(w, http.StatusCreated, s.scaleSetView(set, now))
	return nil
}

// newScaleSet checks a PUT body and makes the scale set it describes.
func newScaleSet(r *http.Request, req *armcompute.VirtualMachineScaleSet, now time.Time) (*scaleSet, error) {
	if req.Location == nil || *req.Location == "" {
		return nil, &armError{status: http.StatusBadRequest, code: "LocationRequired",
			message: "The location property is required for this definition."}
	}
	set := &scaleSet{sub: r.PathValue("sub"), rg: r.PathValue("rg"), name: r.PathValue("vmss"),
		location: normalLocation(*req.Location), uniqueID: newUUID(), created: now,
		tags: maps.Clone(req.Tags), mode: armcompute.OrchestrationModeUniform, prefix: r.PathValue("vmss"),
		version: 1, vms: map[int]*vm{}}
	if sku := req.SKU; sku != nil {
		set.skuName, set.skuTier = sku.Name, sku.Tier
		if sku.Capacity != nil {
			set.capacity = *sku.Capacity
		}
	}
	if set.capacity < 0 {
		return nil, errInvalidParameter("sku.capacity", "The capacity %d is not valid; it must not be negative.", set.capacity)
	}
	if p := req.Properties; p != nil {
		applyModel(set, p)
	}
	return set, nil
}

// applyModel takes the orchestration mode, computer name prefix and image
// of a PUT body.
func applyModel(set *scaleSet, p *armcompute.VirtualMachineScaleSetProperties) {
	if p.OrchestrationMode != nil {
		set.mode = *p.OrchestrationMode
	}
	profile := p.VirtualMachineProfile
	if profile == nil {
		return
	}
	if osp := profile.OSProfile; osp != nil && osp.ComputerNamePrefix != nil && *osp.ComputerNamePrefix != "" {
		set.prefix = *osp.ComputerNamePrefix
	}
	if st := profile.StorageProfile; st != nil && st.ImageReference != nil {
		set.image = cloneImage(st.ImageReference)
	}
}

func cloneImage(img *armcompute.ImageReference) *armcompute.ImageReference {
	if img == nil {
		return nil
	}
	c := *img
	return &c
}

// lookupScaleSet finds the scale set a {vmss} path names: the name (any
// casing) in that subscription and resource group.
func (s *server) lookupScaleSet(r *http.Request) (*scaleSet, error) {
	sub, rg, name := r.PathValue("sub"), r.PathValue("rg"), r.PathValue("vmss")
	set := s.sets[strings.ToLower(name)]
	if set == nil || !strings.EqualFold(set.sub, sub) || !strings.EqualFold(set.rg, rg) {
		return nil, errResourceNotFound(rg, "virtualMachineScaleSets/"+name)
	}
	return set, nil
}

func (s *server) getScaleSet(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, err := s.lookupScaleSet(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.scaleSetView(set, now))
	return nil
}

// listScaleSets is GET .../virtualMachineScaleSets: the resource group's
// scale sets by name, a page at a time.
func (s *server) listScaleSets(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	var entries []pageEntry[*scaleSet]
	for key, set := range s.sets {
		if strings.EqualFold(set.sub, r.PathValue("sub")) && strings.EqualFold(set.rg, r.PathValue("rg")) {
			entries = append(entries, pageEntry[*scaleSet]{key: key, item: set})
		}
	}
	page, next, err := paginate(r, entries, s.cfg.pageSize)
	if err != nil {
		return err
	}
	list := &armcompute.VirtualMachineScaleSetListResult{Value: []*armcompute.VirtualMachineScaleSet{}, NextLink: next}
	for _, set := range page {
		list.Value = append(list.Value, s.scaleSetView(set, now))
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

// scaleSetView is the VirtualMachineScaleSet as GET answers it: Updating
// while an operation on it is InProgress, else Succeeded.
func (s *server) scaleSetView(set *scaleSet, now time.Time) *armcompute.VirtualMachineScaleSet {
	state := "Succeeded"
	if now.Before(set.busyUntil) {
		state = "Updating"
	}
	return &armcompute.VirtualMachineScaleSet{
		ID: ptr(set.id()), Name: ptr(set.name), Type: ptr(scaleSetType), Location: ptr(set.location),
		Tags: maps.Clone(set.tags), Etag: ptr(set.etag()),
		SKU: &armcompute.SKU{Name: set.skuName, Tier: set.skuTier, Capacity: ptr(set.capacity)},
		Properties: &armcompute.VirtualMachineScaleSetProperties{
			ProvisioningState: ptr(state), UniqueID: ptr(set.uniqueID), TimeCreated: ptr(set.created),
			OrchestrationMode: ptr(set.mode),
			UpgradePolicy:     &armcompute.UpgradePolicy{Mode: ptr(armcompute.UpgradeModeManual)},
			VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{
				OSProfile:      &armcompute.VirtualMachineScaleSetOSProfile{ComputerNamePrefix: ptr(set.prefix)},
				StorageProfile: &armcompute.VirtualMachineScaleSetStorageProfile{ImageReference: cloneImage(set.image)},
			},
		},
	}
}
