package main

import (
	"net/http"
	"slices"
	"strings"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// group is a zonal managed instance group. Its target size is stored, not
// counted: an instance that vanishes (/fake/.../delete) leaves it unchanged.
type group struct {
	project, zone, name, base string
	template                  string // full URL
	id                        uint64
	created                   time.Time
	targetSize                int64
}

func (g *group) key() string      { return g.project + "/" + g.zone + "/" + g.name }
func (g *group) selfLink() string { return link(groupPath(g.project, g.zone, g.name)) }

// insertGroup creates a group and its targetSize instances at once, as an
// installer would set one up.
func (s *server) insertGroup(r *http.Request) (any, error) {
	var req compute.InstanceGroupManager
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	p, zone := s.project(r), r.PathValue("zone")
	if op, err := s.replay(p, r); op != nil || err != nil {
		return op, err
	}
	g, tmpl, err := s.validGroup(&req, p, zone)
	if err != nil {
		return nil, err
	}
	s.groups[g.key()] = g
	for range req.TargetSize {
		s.addInstance(g, tmpl, s.freeInstanceName(g), now)
	}
	o := s.newOperation(r, p, zone, "insert", g.selfLink(), g.id)
	return s.answer(o), nil
}

// validGroup checks an insert request and makes the group it asks for.
func (s *server) validGroup(req *compute.InstanceGroupManager, project, zone string) (*group, *compute.InstanceTemplate, error) {
	if err := checkName("resource.name", req.Name); err != nil {
		return nil, nil, err
	}
	if err := checkName("resource.baseInstanceName", req.BaseInstanceName); err != nil {
		return nil, nil, err
	}
	if req.TargetSize < 0 {
		return nil, nil, errInvalid("Invalid value for field 'resource.targetSize': '%d'.", req.TargetSize)
	}
	ref := req.InstanceTemplate
	if ref == "" && len(req.Versions) > 0 {
		ref = req.Versions[0].InstanceTemplate
	}
	if ref == "" {
		return nil, nil, errRequired("resource.instanceTemplate")
	}
	tmpl, err := s.templateByRef(ref, project)
	if err != nil {
		return nil, nil, err
	}
	g := &group{project: project, zone: zone, name: req.Name, base: req.BaseInstanceName,
		template: tmpl.SelfLink, id: s.newID(), created: time.Now(), targetSize: req.TargetSize}
	if s.groups[g.key()] != nil {
		return nil, nil, errAlreadyExists(groupPath(project, zone, req.Name))
	}
	return g, tmpl, nil
}

// freeInstanceName is <baseInstanceName>-<4 random [a-z0-9]>, unused in the zone.
func (s *server) freeInstanceName(g *group) string {
	for {
		name := g.base + "-" + randomString("abcdefghijklmnopqrstuvwxyz0123456789", 4)
		if s.instances[g.project+"/"+g.zone+"/"+name] == nil {
			return name
		}
	}
}

// lookupGroup finds the group an instanceGroupManagers/{igm} path names.
func (s *server) lookupGroup(r *http.Request) (*group, error) {
	p, zone, name := s.project(r), r.PathValue("zone"), r.PathValue("igm")
	if g := s.groups[p+"/"+zone+"/"+name]; g != nil {
		return g, nil
	}
	return nil, errNotFound(groupPath(p, zone, name))
}

func (s *server) getGroup(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	g, err := s.lookupGroup(r)
	if err != nil {
		return nil, err
	}
	return s.groupView(g, now), nil
}

// groupView is the InstanceGroupManager as GET answers it.
func (s *server) groupView(g *group, now time.Time) *compute.InstanceGroupManager {
	actions := &compute.InstanceGroupManagerActionsSummary{
		ForceSendFields: []string{"Creating", "Deleting", "None"},
	}
	for _, in := range s.groupInstances(g) {
		switch currentAction(s.status(in, now)) {
		case "CREATING":
			actions.Creating++
		case "DELETING":
			actions.Deleting++
		default:
			actions.None++
		}
	}
	return &compute.InstanceGroupManager{
		Kind: "compute#instanceGroupManager", Id: g.id, Name: g.name,
		SelfLink: g.selfLink(), Zone: link(zonePath(g.project, g.zone)),
		BaseInstanceName: g.base, InstanceTemplate: g.template,
		Versions:          []*compute.InstanceGroupManagerVersion{{InstanceTemplate: g.template}},
		InstanceGroup:     link(zonePath(g.project, g.zone) + "/instanceGroups/" + g.name),
		TargetSize:        g.targetSize,
		CreationTimestamp: timestamp(g.created),
		CurrentActions:    actions,
		Status: &compute.InstanceGroupManagerStatus{IsStable: actions.Creating+actions.Deleting == 0,
			ForceSendFields: []string{"IsStable"}},
		ForceSendFields: []string{"TargetSize"},
	}
}

// groupInstances are the group's instances (not yet gone), sorted by name.
func (s *server) groupInstances(g *group) []*instance {
	var out []*instance
	for _, in := range s.instances {
		if in.project == g.project && in.zone == g.zone && in.group == g.name {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b *instance) int { return strings.Compare(a.name, b.name) })
	return out
}

func (s *server) aggregatedGroups(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	p := s.project(r)
	var entries []pageEntry[*group]
	for _, g := range s.groups {
		if g.project == p {
			entries = append(entries, pageEntry[*group]{name: g.name, zone: g.zone, item: g})
		}
	}
	page, next, err := paginate(entries, r.URL.Query())
	if err != nil {
		return nil, err
	}
	items := map[string]compute.InstanceGroupManagersScopedList{}
	for _, e := range page {
		scoped := items["zones/"+e.zone]
		scoped.InstanceGroupManagers = append(scoped.InstanceGroupManagers, s.groupView(e.item, now))
		items["zones/"+e.zone] = scoped
	}
	return &compute.InstanceGroupManagerAggregatedList{
		Kind: "compute#instanceGroupManagerAggregatedList", Id: "projects/" + p + "/aggregated/instanceGroupManagers",
		Items: items, NextPageToken: next, SelfLink: link("projects/" + p + "/aggregated/instanceGroupManagers"),
	}, nil
}
