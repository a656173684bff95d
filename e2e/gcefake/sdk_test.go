package main

// Drives the fake with Google's own generated client, as a node operator's
// tool would, so that every answer goes through the SDK's decoding, paging
// and error handling: if the fake's wire format drifted from the real API's,
// these calls would fail or read empty fields.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

// sdk is a compute client on a fresh fake.
type sdk struct {
	t   *testing.T
	ctx context.Context
	svc *compute.Service
}

func startSDK(t *testing.T) *sdk {
	t.Helper()
	// boot and stop no longer than an operation: once a wait returns DONE, a
	// new instance is RUNNING and a deleted one gone, without sleeps.
	f := startFake(t, func(c *config) {
		c.boot, c.stop, c.opDelay = 100*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond
	})
	ctx := t.Context()
	svc, err := compute.NewService(ctx, option.WithEndpoint(f.url+"/compute/v1/"),
		option.WithoutAuthentication(), option.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return &sdk{t: t, ctx: ctx, svc: svc}
}

// wait blocks on a zonal operation (or a global one, zone "") until DONE and
// fails the test if it ended in an error.
func (s *sdk) wait(op *compute.Operation, zone string) *compute.Operation {
	s.t.Helper()
	for op.Status != "DONE" {
		var err error
		if zone == "" {
			op, err = s.svc.GlobalOperations.Wait(testProject, op.Name).Context(s.ctx).Do()
		} else {
			op, err = s.svc.ZoneOperations.Wait(testProject, zone, op.Name).Context(s.ctx).Do()
		}
		if err != nil {
			s.t.Fatalf("wait: %v", err)
		}
	}
	if op.Error != nil {
		s.t.Fatalf("operation failed: %+v", op.Error.Errors[0])
	}
	return op
}

// must takes a call's two results and, given the test, fails it on the
// error or returns the value: must(call.Do())(t).
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func (s *sdk) insertTemplate(name, image string) {
	s.t.Helper()
	tmpl := &compute.InstanceTemplate{Name: name, Properties: &compute.InstanceProperties{
		MachineType: "e2-small",
		Disks: []*compute.AttachedDisk{{Boot: true, AutoDelete: true,
			InitializeParams: &compute.AttachedDiskInitializeParams{SourceImage: image}}},
	}}
	s.wait(must(s.svc.InstanceTemplates.Insert(testProject, tmpl).Context(s.ctx).Do())(s.t), "")
}

// insertGroup makes an empty group in zone on template t1. The SDK omits a
// zero targetSize unless forced; a client that means 0 sends it.
func (s *sdk) insertGroup(zone, name string) {
	s.t.Helper()
	igm := &compute.InstanceGroupManager{Name: name, BaseInstanceName: "w",
		InstanceTemplate: "global/instanceTemplates/t1", ForceSendFields: []string{"TargetSize"}}
	s.wait(must(s.svc.InstanceGroupManagers.Insert(testProject, zone, igm).Context(s.ctx).Do())(s.t), zone)
}

func (s *sdk) createInstance(name, requestID string) *compute.Operation {
	s.t.Helper()
	req := &compute.InstanceGroupManagersCreateInstancesRequest{Instances: []*compute.PerInstanceConfig{{Name: name}}}
	return must(s.svc.InstanceGroupManagers.CreateInstances(testProject, testZone, "workers", req).
		RequestId(requestID).Context(s.ctx).Do())(s.t)
}

// managedNames lists the group's instances one per page, to go through Pages.
func (s *sdk) managedNames() []string {
	s.t.Helper()
	var names []string
	err := s.svc.InstanceGroupManagers.ListManagedInstances(testProject, testZone, "workers").MaxResults(1).
		Pages(s.ctx, func(page *compute.InstanceGroupManagersListManagedInstancesResponse) error {
			for _, m := range page.ManagedInstances {
				names = append(names, m.Name)
			}
			return nil
		})
	return must(names, err)(s.t)
}

func TestSDKGroupLifecycle(t *testing.T) {
	s := startSDK(t)
	s.insertTemplate("t1", image1)
	s.insertGroup(testZone, "workers")
	igms := s.svc.InstanceGroupManagers

	const rid = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	first := s.createInstance("w-one", rid)
	if done := s.wait(first, testZone); done.OperationType != opCreateInstances || done.Progress != 100 {
		t.Fatalf("createInstances: %+v", done)
	}
	// A retry with the same requestId is answered with the first operation.
	if again := s.createInstance("w-one", rid); again.Name != first.Name || again.Status != "DONE" {
		t.Fatalf("repeated requestId: %+v", again)
	}
	s.wait(s.createInstance("w-two", "2f1e4a0c-9d8b-4c7a-8e6f-5a4b3c2d1e0f"), testZone)
	if got := s.managedNames(); len(got) != 2 || got[0] != "w-one" || got[1] != "w-two" {
		t.Fatalf("managed instances: %v", got)
	}

	in := must(s.svc.Instances.Get(testProject, testZone, "w-one").Context(s.ctx).Do())(t)
	meta := map[string]string{}
	for _, item := range in.Metadata.Items {
		meta[item.Key] = *item.Value
	}
	createdBy := "projects/123456789012/zones/" + testZone + "/instanceGroupManagers/workers"
	if in.Status != "RUNNING" || in.Id == 0 || meta["created-by"] != createdBy {
		t.Fatalf("instance: %+v, metadata %v", in, meta)
	}
	disk := must(s.svc.Disks.Get(testProject, testZone, "w-one").Context(s.ctx).Do())(t)
	if disk.SourceImage != image1 || len(disk.Users) != 1 || disk.Users[0] != in.SelfLink {
		t.Fatalf("disk: %+v", disk)
	}

	// A new template: instances made after it boot from its image.
	s.insertTemplate("t2", image2)
	setReq := &compute.InstanceGroupManagersSetInstanceTemplateRequest{InstanceTemplate: "global/instanceTemplates/t2"}
	s.wait(must(igms.SetInstanceTemplate(testProject, testZone, "workers", setReq).Context(s.ctx).Do())(t), testZone)
	s.wait(s.createInstance("w-three", "0d3c2b1a-4e5f-4a6b-8c7d-9e0f1a2b3c4d"), testZone)
	if d := must(s.svc.Disks.Get(testProject, testZone, "w-three").Context(s.ctx).Do())(t); d.SourceImage != image2 {
		t.Fatalf("disk after setInstanceTemplate: %+v", d)
	}

	// The instance is referred to by its selfLink, as listManagedInstances gives it.
	delReq := &compute.InstanceGroupManagersDeleteInstancesRequest{Instances: []string{in.SelfLink}}
	s.wait(must(igms.DeleteInstances(testProject, testZone, "workers", delReq).Context(s.ctx).Do())(t), testZone)
	_, err := s.svc.Instances.Get(testProject, testZone, "w-one").Context(s.ctx).Do()
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) || gerr.Code != http.StatusNotFound || len(gerr.Errors) != 1 ||
		gerr.Errors[0].Reason != "notFound" {
		t.Fatalf("deleted instance: %v", err)
	}
	igm := must(igms.Get(testProject, testZone, "workers").Context(s.ctx).Do())(t)
	if igm.TargetSize != 2 || igm.InstanceTemplate != apiBase+"projects/proj/global/instanceTemplates/t2" {
		t.Fatalf("group: %+v", igm)
	}
}

func TestSDKAggregatedGroups(t *testing.T) {
	s := startSDK(t)
	s.insertTemplate("t1", image1)
	s.insertGroup(testZone, "workers")
	s.insertGroup("us-east1-c", "others")
	// One group a page: the SDK must follow nextPageToken across two pages.
	zoneOf := map[string]string{}
	pages := 0
	err := s.svc.InstanceGroupManagers.AggregatedList(testProject).MaxResults(1).
		Pages(s.ctx, func(page *compute.InstanceGroupManagerAggregatedList) error {
			pages++
			for scope, scoped := range page.Items {
				for _, g := range scoped.InstanceGroupManagers {
					zoneOf[g.Name] = scope
				}
			}
			return nil
		})
	if err != nil || pages != 2 || zoneOf["workers"] != "zones/"+testZone || zoneOf["others"] != "zones/us-east1-c" {
		t.Fatalf("aggregated groups: %v, %d pages, %v", err, pages, zoneOf)
	}
}
