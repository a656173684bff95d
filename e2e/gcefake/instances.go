package main

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// instance is a VM made by a group. What it took from its template (image,
// labels, metadata) is copied at creation, so a later setInstanceTemplate
// leaves it, and its disk, as they were.
type instance struct {
	project, zone, name, group string
	id, diskID                 uint64
	created                    time.Time
	template                   string // URL of the template it was made from
	sourceImage                string // as the template gave it
	deviceName                 string
	machineType                string
	labels                     map[string]string
	metadata                   []*compute.MetadataItems
	ip                         string
	override                   string    // status set by /fake/instances/.../status
	deleting                   time.Time // when deleteInstances took it; zero otherwise
}

func (in *instance) key() string      { return in.project + "/" + in.zone + "/" + in.name }
func (in *instance) selfLink() string { return link(instancePath(in.project, in.zone, in.name)) }

// addInstance creates a PROVISIONING instance of g from tmpl.
func (s *server) addInstance(g *group, tmpl *compute.InstanceTemplate, name string, now time.Time) *instance {
	in := &instance{project: g.project, zone: g.zone, name: name, group: g.name,
		id: s.newID(), diskID: s.newID(), created: now, template: tmpl.SelfLink,
		deviceName: "persistent-disk-0", ip: s.newIP()}
	createdBy := fmt.Sprintf("projects/%d/zones/%s/instanceGroupManagers/%s", s.cfg.projectNumber, g.zone, g.name)
	fromTemplate := fmt.Sprintf("projects/%d/global/instanceTemplates/%s", s.cfg.projectNumber, tmpl.Name)
	if props := tmpl.Properties; props != nil {
		in.labels = maps.Clone(props.Labels)
		in.machineType = props.MachineType
		if len(props.Disks) > 0 && props.Disks[0] != nil {
			copyDiskSettings(in, props.Disks[0])
		}
		if props.Metadata != nil {
			in.metadata = append(in.metadata, props.Metadata.Items...)
		}
	}
	in.metadata = append(in.metadata,
		&compute.MetadataItems{Key: "instance-template", Value: &fromTemplate},
		&compute.MetadataItems{Key: "created-by", Value: &createdBy})
	s.instances[in.key()] = in
	return in
}

func copyDiskSettings(in *instance, d *compute.AttachedDisk) {
	if d.DeviceName != "" {
		in.deviceName = d.DeviceName
	}
	if d.InitializeParams != nil {
		in.sourceImage = d.InitializeParams.SourceImage
	}
}

// newIP is a made-up internal address in 10.128.0.0/10 (last octet 2-251).
func (s *server) newIP() string {
	n := s.newID() % (1 << 22)
	return fmt.Sprintf("10.%d.%d.%d", 128+(n>>16), (n>>8)&0xff, 2+(n&0xff)%250)
}

// status derives the instance's status from its age: PROVISIONING, STAGING
// after boot/2, RUNNING after boot; STOPPING once deleted; or what a test set.
func (s *server) status(in *instance, now time.Time) string {
	age := now.Sub(in.created)
	switch {
	case !in.deleting.IsZero():
		return "STOPPING"
	case in.override != "":
		return in.override
	case age >= s.cfg.boot:
		return "RUNNING"
	case age >= s.cfg.boot/2:
		return "STAGING"
	}
	return "PROVISIONING"
}

// lockedNow drops the instances whose deletion has finished and returns the
// time the answer describes. Call with s.mu held.
func (s *server) lockedNow() time.Time {
	now := time.Now()
	for key, in := range s.instances {
		if !in.deleting.IsZero() && now.Sub(in.deleting) >= s.cfg.stop {
			delete(s.instances, key)
		}
	}
	return now
}

// instanceView is the Instance as GET answers it.
func (s *server) instanceView(in *instance, now time.Time) *compute.Instance {
	zoneURL := link(zonePath(in.project, in.zone))
	v := &compute.Instance{
		Kind: "compute#instance", Id: in.id, Name: in.name, Zone: zoneURL,
		Status: s.status(in, now), SelfLink: in.selfLink(), CreationTimestamp: timestamp(in.created),
		Labels:   in.labels,
		Metadata: &compute.Metadata{Kind: "compute#metadata", Items: in.metadata},
		Disks: []*compute.AttachedDisk{{Kind: "compute#attachedDisk", Boot: true, AutoDelete: true,
			Mode: "READ_WRITE", Type: "PERSISTENT", DeviceName: in.deviceName,
			Source: link(diskPath(in.project, in.zone, in.name))}},
		NetworkInterfaces: []*compute.NetworkInterface{{Kind: "compute#networkInterface", Name: "nic0",
			NetworkIP: in.ip, Network: link("projects/" + in.project + "/global/networks/default")}},
	}
	if in.machineType != "" && !strings.Contains(in.machineType, "/") {
		v.MachineType = zoneURL + "/machineTypes/" + in.machineType
	}
	return v
}

func (s *server) getInstance(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	p, zone, name := s.project(r), r.PathValue("zone"), r.PathValue("instance")
	if in := s.instances[p+"/"+zone+"/"+name]; in != nil {
		return s.instanceView(in, now), nil
	}
	return nil, errNotFound(instancePath(p, zone, name))
}

// instanceEntries are the project's instances (in zone, unless zone is "").
func (s *server) instanceEntries(project, zone string) []pageEntry[*instance] {
	var entries []pageEntry[*instance]
	for _, in := range s.instances {
		if in.project == project && (zone == "" || in.zone == zone) {
			entries = append(entries, pageEntry[*instance]{name: in.name, zone: in.zone, item: in})
		}
	}
	return entries
}

func (s *server) listInstances(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	p, zone := s.project(r), r.PathValue("zone")
	page, next, err := paginate(s.instanceEntries(p, zone), r.URL.Query())
	if err != nil {
		return nil, err
	}
	list := &compute.InstanceList{Kind: "compute#instanceList", Id: zonePath(p, zone) + "/instances",
		SelfLink: link(zonePath(p, zone) + "/instances"), NextPageToken: next}
	for _, e := range page {
		list.Items = append(list.Items, s.instanceView(e.item, now))
	}
	return list, nil
}

// aggregatedInstances pages over all zones' instances by name; the filter
// parameter is accepted and ignored.
func (s *server) aggregatedInstances(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	p := s.project(r)
	page, next, err := paginate(s.instanceEntries(p, ""), r.URL.Query())
	if err != nil {
		return nil, err
	}
	items := map[string]compute.InstancesScopedList{}
	for _, e := range page {
		scoped := items["zones/"+e.zone]
		scoped.Instances = append(scoped.Instances, s.instanceView(e.item, now))
		items["zones/"+e.zone] = scoped
	}
	return &compute.InstanceAggregatedList{
		Kind: "compute#instanceAggregatedList", Id: "projects/" + p + "/aggregated/instances",
		Items: items, NextPageToken: next, SelfLink: link("projects/" + p + "/aggregated/instances"),
	}, nil
}

// getDisk answers the boot disk of the instance of the same name; it goes
// when the instance goes.
func (s *server) getDisk(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedNow()
	p, zone, name := s.project(r), r.PathValue("zone"), r.PathValue("disk")
	in := s.instances[p+"/"+zone+"/"+name]
	if in == nil {
		return nil, errNotFound(diskPath(p, zone, name))
	}
	return &compute.Disk{
		Kind: "compute#disk", Id: in.diskID, Name: in.name, SourceImage: in.sourceImage,
		SelfLink: link(diskPath(p, zone, name)), Zone: link(zonePath(p, zone)), Status: "READY",
		CreationTimestamp: timestamp(in.created), Users: []string{in.selfLink()},
	}, nil
}
