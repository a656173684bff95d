package main

// Drives the fake with Azure's own SDK (armcompute on azcore), as a node
// operator's tool would, so that every answer goes through the SDK's
// decoding, paging, long-running-operation pollers and error handling: if the
// fake's wire format or LRO protocol drifted from ARM's, these calls would
// fail, hang or read empty fields.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6"
)

// sdk holds the two clients an operator's tool uses, on a fresh fake.
type sdk struct {
	t    *testing.T
	ctx  context.Context
	sets *armcompute.VirtualMachineScaleSetsClient
	vms  *armcompute.VirtualMachineScaleSetVMsClient
}

func startSDK(t *testing.T) *sdk {
	t.Helper()
	// Pages of 2 so that lists need nextLink. boot and stop no longer than an
	// operation: once a poller is done, new VMs run and deleted ones are gone.
	f := startFake(t, func(c *config) {
		c.pageSize, c.opDelay, c.boot, c.stop = 2, 200*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	})
	opts := &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: cloud.Configuration{Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: f.url, Audience: "https://management.core.windows.net/"},
		}},
		InsecureAllowCredentialWithHTTP: true, // the fake is plain http
	}}
	s := &sdk{t: t, ctx: t.Context()}
	var err error
	if s.sets, err = armcompute.NewVirtualMachineScaleSetsClient(testSub, &azfake.TokenCredential{}, opts); err != nil {
		t.Fatal(err)
	}
	if s.vms, err = armcompute.NewVirtualMachineScaleSetVMsClient(testSub, &azfake.TokenCredential{}, opts); err != nil {
		t.Fatal(err)
	}
	return s
}

// finish takes a Begin* call's results and, given the test, polls the
// operation to its end and returns its result, failing the test on an error:
// finish(s.sets.BeginX(...))(t). One second between polls is the least the
// SDK allows outside tests (it skips that check under go test; an operator's
// tool cannot).
func finish[T any](p *runtime.Poller[T], err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.PollUntilDone(t.Context(), &runtime.PollUntilDoneOptions{Frequency: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

// must takes a call's two results and, given the test, fails it on the error
// or returns the value: must(call(...))(t).
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// create makes scale set name with capacity VMs of image1.
func (s *sdk) create(name string, capacity int64) *armcompute.VirtualMachineScaleSet {
	s.t.Helper()
	body := armcompute.VirtualMachineScaleSet{
		Location: ptr("westeurope"),
		SKU:      &armcompute.SKU{Name: ptr("Standard_D2s_v3"), Tier: ptr("Standard"), Capacity: ptr(capacity)},
		Properties: &armcompute.VirtualMachineScaleSetProperties{
			OrchestrationMode: ptr(armcompute.OrchestrationModeUniform),
			UpgradePolicy:     &armcompute.UpgradePolicy{Mode: ptr(armcompute.UpgradeModeManual)},
			VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{
				OSProfile:      &armcompute.VirtualMachineScaleSetOSProfile{ComputerNamePrefix: ptr("worker")},
				StorageProfile: &armcompute.VirtualMachineScaleSetStorageProfile{ImageReference: &armcompute.ImageReference{ID: ptr(image1)}},
			},
		},
	}
	resp := finish(s.sets.BeginCreateOrUpdate(s.ctx, testRG, name, body, nil))(s.t)
	return &resp.VirtualMachineScaleSet
}

// listVMs pages through the VMs of "workers".
func (s *sdk) listVMs() []*armcompute.VirtualMachineScaleSetVM {
	s.t.Helper()
	var all []*armcompute.VirtualMachineScaleSetVM
	for pager := s.vms.NewListPager(testRG, "workers", nil); pager.More(); {
		page := must(pager.NextPage(s.ctx))(s.t)
		all = append(all, page.Value...)
	}
	return all
}

// responseError is err as the SDK's *azcore.ResponseError, or fails the test.
func responseError(t *testing.T, err error) *azcore.ResponseError {
	t.Helper()
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("want an *azcore.ResponseError, got %v", err)
	}
	return re
}

func TestSDKScaleSetLifecycle(t *testing.T) {
	s := startSDK(t)
	created := s.create("workers", 2)
	if *created.ID != vmssPath || *created.SKU.Capacity != 2 || *created.Properties.ProvisioningState != "Succeeded" {
		t.Fatalf("created: %s", mustJSON(created))
	}
	got := must(s.sets.Get(s.ctx, testRG, "workers", nil))(t)
	etag := *got.Etag
	if *got.Properties.VirtualMachineProfile.StorageProfile.ImageReference.ID != image1 || etag != `"1"` {
		t.Fatalf("get: %s", mustJSON(&got))
	}

	// Scale out by one under the current etag, as an operator guards against
	// a concurrent change.
	grow := armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: ptr[int64](3)}}
	ifMatch := &armcompute.VirtualMachineScaleSetsClientBeginUpdateOptions{IfMatch: &etag}
	grown := finish(s.sets.BeginUpdate(s.ctx, testRG, "workers", grow, ifMatch))(t)
	if *grown.SKU.Capacity != 3 || *grown.Properties.ProvisioningState != "Succeeded" || *grown.Etag == etag {
		t.Fatalf("after scale-out: %s", mustJSON(&grown))
	}
	vms := s.listVMs()
	if instanceIDs(vms) != "0,1,2" || *vms[2].Properties.OSProfile.ComputerName != "worker000002" {
		t.Fatalf("VMs: %s", mustJSON(vms))
	}
	view := must(s.vms.GetInstanceView(s.ctx, testRG, "workers", "2", nil))(t)
	if len(view.Statuses) != 2 || *view.Statuses[0].Code != "ProvisioningState/succeeded" ||
		*view.Statuses[1].Code != "PowerState/running" {
		t.Fatalf("instance view: %s", mustJSON(&view))
	}

	// The etag read before the scale-out is stale now.
	_, err := s.sets.BeginUpdate(s.ctx, testRG, "workers", grow, ifMatch)
	if re := responseError(t, err); re.StatusCode != http.StatusPreconditionFailed || re.ErrorCode != "PreconditionFailed" {
		t.Fatalf("stale If-Match: %v", err)
	}

	ids := armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{ptr("0")}}
	finish(s.sets.BeginDeleteInstances(s.ctx, testRG, "workers", ids, nil))(t)
	_, err = s.vms.Get(s.ctx, testRG, "workers", "0", nil)
	if re := responseError(t, err); re.StatusCode != http.StatusNotFound || re.ErrorCode != "ResourceNotFound" {
		t.Fatalf("deleted VM: %v", err)
	}

	// A new image in the model: existing VMs keep theirs and say so.
	imageUpdate := armcompute.VirtualMachineScaleSetUpdate{Properties: &armcompute.VirtualMachineScaleSetUpdateProperties{
		VirtualMachineProfile: &armcompute.VirtualMachineScaleSetUpdateVMProfile{
			StorageProfile: &armcompute.VirtualMachineScaleSetUpdateStorageProfile{
				ImageReference: &armcompute.ImageReference{ID: ptr(image2)}},
		},
	}}
	updated := finish(s.sets.BeginUpdate(s.ctx, testRG, "workers", imageUpdate, nil))(t)
	if *updated.Properties.VirtualMachineProfile.StorageProfile.ImageReference.ID != image2 || *updated.SKU.Capacity != 2 {
		t.Fatalf("after image change: %s", mustJSON(&updated))
	}
	for _, v := range s.listVMs() {
		if *v.Properties.LatestModelApplied || *v.Properties.StorageProfile.ImageReference.ID != image1 {
			t.Fatalf("VM after image change: %s", mustJSON(v))
		}
	}
}

func TestSDKListScaleSets(t *testing.T) {
	s := startSDK(t)
	for _, name := range []string{"c", "a", "b"} {
		s.create(name, 0)
	}
	var names []string
	pages := 0
	for pager := s.sets.NewListPager(testRG, nil); pager.More(); pages++ {
		page := must(pager.NextPage(s.ctx))(t)
		for _, set := range page.Value {
			names = append(names, *set.Name)
		}
	}
	if pages != 2 || len(names) != 3 || names[0] != "a" || names[2] != "c" {
		t.Fatalf("%d pages: %v", pages, names)
	}
}
