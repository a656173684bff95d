package main

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6"
)

// vm is a scale set's VM. Its image is the model's when it was made; a later
// image change leaves it as it is (latestModelApplied false).
type vm struct {
	instanceID  int
	vmID        string
	created     time.Time
	image       *armcompute.ImageReference
	latestModel bool
	deleting    time.Time // when a delete or a scale-in took it; zero otherwise
	// provisioning and power are what /fake/vms/.../state set; "" = derived.
	provisioning, power string
}

// addVM makes a Creating VM with the next instance id and the model's image.
func (set *scaleSet) addVM(now time.Time) *vm {
	v := &vm{instanceID: set.nextID, vmID: newUUID(), created: now, image: cloneImage(set.image), latestModel: true}
	set.vms[v.instanceID] = v
	set.nextID++
	return v
}

// vmByInstanceID finds a VM by its instance id as ARM writes it ("3", not "03").
func (set *scaleSet) vmByInstanceID(id string) *vm {
	n, err := strconv.Atoi(id)
	if err != nil || strconv.Itoa(n) != id {
		return nil
	}
	return set.vms[n]
}

// sortedVMs are the VMs by instance id.
func (set *scaleSet) sortedVMs() []*vm {
	out := make([]*vm, 0, len(set.vms))
	for _, v := range set.vms {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *vm) int { return a.instanceID - b.instanceID })
	return out
}

// liveVMs are the VMs not deleting, by instance id.
func (set *scaleSet) liveVMs() []*vm {
	return slices.DeleteFunc(set.sortedVMs(), func(v *vm) bool { return !v.deleting.IsZero() })
}

// lockedNow drops the VMs whose deletion has finished and returns the time
// the answer describes. Call with s.mu held.
func (s *server) lockedNow() time.Time {
	now := time.Now()
	for _, set := range s.sets {
		for id, v := range set.vms {
			if !v.deleting.IsZero() && now.Sub(v.deleting) >= s.cfg.stop {
				delete(set.vms, id)
			}
		}
	}
	return now
}

// provisioningState is Deleting once deleted, else what a test set, else
// Creating until -boot has passed, then Succeeded.
func (s *server) provisioningState(v *vm, now time.Time) string {
	switch {
	case !v.deleting.IsZero():
		return "Deleting"
	case v.provisioning != "":
		return v.provisioning
	case now.Sub(v.created) < s.cfg.boot:
		return "Creating"
	}
	return "Succeeded"
}

// powerState follows the same order: stopping, what a test set, starting,
// running.
func (s *server) powerState(v *vm, now time.Time) string {
	switch {
	case !v.deleting.IsZero():
		return "stopping"
	case v.power != "":
		return v.power
	case now.Sub(v.created) < s.cfg.boot:
		return "starting"
	}
	return "running"
}

// vmView is the VirtualMachineScaleSetVM as GET and list answer it, with its
// instance view when the request says $expand=instanceView.
func (s *server) vmView(r *http.Request, set *scaleSet, v *vm, now time.Time) *armcompute.VirtualMachineScaleSetVM {
	id := strconv.Itoa(v.instanceID)
	view := &armcompute.VirtualMachineScaleSetVM{
		ID: ptr(set.id() + "/virtualMachines/" + id), Name: ptr(set.name + "_" + id), InstanceID: ptr(id),
		Location: ptr(set.location), Type: ptr(scaleSetVMType),
		Properties: &armcompute.VirtualMachineScaleSetVMProperties{
			ProvisioningState: ptr(s.provisioningState(v, now)), VMID: ptr(v.vmID),
			LatestModelApplied: ptr(v.latestModel), TimeCreated: ptr(v.created),
			OSProfile:      &armcompute.OSProfile{ComputerName: ptr(computerName(set.prefix, v.instanceID))},
			StorageProfile: &armcompute.StorageProfile{ImageReference: cloneImage(v.image)},
		},
	}
	if set.skuName != nil || set.skuTier != nil {
		view.SKU = &armcompute.SKU{Name: set.skuName, Tier: set.skuTier}
	}
	if strings.EqualFold(r.URL.Query().Get("$expand"), "instanceView") {
		view.Properties.InstanceView = s.instanceView(set, v, now)
	}
	return view
}

// instanceView is the VM's VirtualMachineScaleSetVMInstanceView: its
// ProvisioningState/<state> and PowerState/<power> statuses.
func (s *server) instanceView(set *scaleSet, v *vm, now time.Time) *armcompute.VirtualMachineScaleSetVMInstanceView {
	state := strings.ToLower(s.provisioningState(v, now))
	level := armcompute.StatusLevelTypesInfo
	if state == "failed" {
		level = armcompute.StatusLevelTypesError
	}
	power := strings.ToLower(s.powerState(v, now))
	return &armcompute.VirtualMachineScaleSetVMInstanceView{
		ComputerName: ptr(computerName(set.prefix, v.instanceID)),
		Statuses: []*armcompute.InstanceViewStatus{
			{Code: ptr("ProvisioningState/" + state), Level: ptr(level), DisplayStatus: ptr("Provisioning " + state)},
			{Code: ptr("PowerState/" + power), Level: ptr(armcompute.StatusLevelTypesInfo), DisplayStatus: ptr("VM " + power)},
		},
	}
}

// lookupVM finds the scale set and the VM a .../virtualMachines/{instance}
// path names.
func (s *server) lookupVM(r *http.Request) (*scaleSet, *vm, error) {
	set, err := s.lookupScaleSet(r)
	if err != nil {
		return nil, nil, err
	}
	id := r.PathValue("instance")
	v := set.vmByInstanceID(id)
	if v == nil {
		return nil, nil, errResourceNotFound(r.PathValue("rg"),
			fmt.Sprintf("virtualMachineScaleSets/%s/virtualMachines/%s", r.PathValue("vmss"), id))
	}
	return set, v, nil
}

func (s *server) getVM(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, v, err := s.lookupVM(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.vmView(r, set, v, now))
	return nil
}

func (s *server) getInstanceView(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, v, err := s.lookupVM(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.instanceView(set, v, now))
	return nil
}

// listVMs is GET {vmss}/virtualMachines: the VMs not yet gone, by instance id
// (numerically), a page at a time.
func (s *server) listVMs(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, err := s.lookupScaleSet(r)
	if err != nil {
		return err
	}
	var entries []pageEntry[*vm]
	for _, v := range set.vms {
		entries = append(entries, pageEntry[*vm]{key: fmt.Sprintf("%012d", v.instanceID), item: v})
	}
	page, next, err := paginate(r, entries, s.cfg.pageSize)
	if err != nil {
		return err
	}
	list := &armcompute.VirtualMachineScaleSetVMListResult{Value: []*armcompute.VirtualMachineScaleSetVM{}, NextLink: next}
	for _, v := range page {
		list.Value = append(list.Value, s.vmView(r, set, v, now))
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}
