package main

import (
	"fmt"
	"net/http"

	compute "google.golang.org/api/compute/v1"
)

// Operation types of the group methods, as GCE names custom methods.
const (
	opCreateInstances     = "compute.instanceGroupManagers.createInstances"
	opDeleteInstances     = "compute.instanceGroupManagers.deleteInstances"
	opSetInstanceTemplate = "compute.instanceGroupManagers.setInstanceTemplate"
)

// createInstances adds instances with the given names to the group. A name
// already taken in the zone makes the operation end in RESOURCE_ALREADY_EXISTS
// and nothing is created.
func (s *server) createInstances(r *http.Request) (any, error) {
	var req compute.InstanceGroupManagersCreateInstancesRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	if op, err := s.replay(s.project(r), r); op != nil || err != nil {
		return op, err
	}
	g, err := s.lookupGroup(r)
	if err != nil {
		return nil, err
	}
	names, err := requestedNames(req.Instances)
	if err != nil {
		return nil, err
	}
	o := s.newOperation(r, g.project, g.zone, opCreateInstances, g.selfLink(), g.id)
	if taken := s.takenNames(g, names); len(taken) > 0 {
		o.fail(http.StatusConflict, taken...)
		return s.answer(o), nil
	}
	tmpl, err := s.templateByRef(g.template, g.project)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		s.addInstance(g, tmpl, name, now)
		g.targetSize++
	}
	return s.answer(o), nil
}

// requestedNames are the valid names of a createInstances request.
func requestedNames(configs []*compute.PerInstanceConfig) ([]string, error) {
	if len(configs) == 0 {
		return nil, errRequired("instances")
	}
	seen := map[string]bool{}
	var names []string
	for i, c := range configs {
		if c == nil || seen[c.Name] {
			return nil, errInvalid("Invalid value for field 'instances[%d]': duplicate or empty.", i)
		}
		if err := checkName(fmt.Sprintf("instances[%d].name", i), c.Name); err != nil {
			return nil, err
		}
		seen[c.Name] = true
		names = append(names, c.Name)
	}
	return names, nil
}

// takenNames are the operation errors for names already used in the zone.
func (s *server) takenNames(g *group, names []string) []*compute.OperationErrorErrors {
	var errs []*compute.OperationErrorErrors
	for _, name := range names {
		if s.instances[g.project+"/"+g.zone+"/"+name] != nil {
			errs = append(errs, &compute.OperationErrorErrors{Code: "RESOURCE_ALREADY_EXISTS",
				Message: fmt.Sprintf("The resource '%s' already exists", instancePath(g.project, g.zone, name))})
		}
	}
	return errs
}

// deleteInstances starts deleting named members of the group: each is
// STOPPING for -stop, then gone; the target size drops at once.
func (s *server) deleteInstances(r *http.Request) (any, error) {
	var req compute.InstanceGroupManagersDeleteInstancesRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	if op, err := s.replay(s.project(r), r); op != nil || err != nil {
		return op, err
	}
	g, err := s.lookupGroup(r)
	if err != nil {
		return nil, err
	}
	members, err := s.namedMembers(g, req.Instances, req.SkipInstancesOnValidationError)
	if err != nil {
		return nil, err
	}
	for _, in := range members {
		if in.deleting.IsZero() { // a second delete of a deleting instance changes nothing
			in.deleting = now
			g.targetSize--
		}
	}
	o := s.newOperation(r, g.project, g.zone, opDeleteInstances, g.selfLink(), g.id)
	return s.answer(o), nil
}

// namedMembers resolves deleteInstances references to instances of g. One
// that is not a member is skipped when skip is set, else the request is
// rejected (and nothing is deleted).
func (s *server) namedMembers(g *group, refs []string, skip bool) ([]*instance, error) {
	if len(refs) == 0 {
		return nil, errRequired("instances")
	}
	var members []*instance
	for _, ref := range refs {
		in := s.member(g, ref)
		if in != nil {
			members = append(members, in)
			continue
		}
		if !skip {
			return nil, errInvalid("The instance '%s' is not a member of the instance group manager '%s'.",
				ref, groupPath(g.project, g.zone, g.name))
		}
	}
	return members, nil
}

// member is the instance a reference names if it belongs to g, else nil.
func (s *server) member(g *group, ref string) *instance {
	project, zone, name, ok := parseInstanceRef(ref)
	if !ok || zone != g.zone {
		return nil
	}
	if project != "" && project != g.project && project != fmt.Sprint(s.cfg.projectNumber) {
		return nil
	}
	in := s.instances[g.project+"/"+zone+"/"+name]
	if in == nil || in.group != g.name {
		return nil
	}
	return in
}

// setInstanceTemplate points the group at another template; instances made
// later boot from it, existing ones keep their disks.
func (s *server) setInstanceTemplate(r *http.Request) (any, error) {
	var req compute.InstanceGroupManagersSetInstanceTemplateRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if op, err := s.replay(s.project(r), r); op != nil || err != nil {
		return op, err
	}
	g, err := s.lookupGroup(r)
	if err != nil {
		return nil, err
	}
	if req.InstanceTemplate == "" {
		return nil, errRequired("instanceTemplate")
	}
	tmpl, err := s.templateByRef(req.InstanceTemplate, g.project)
	if err != nil {
		return nil, err
	}
	g.template = tmpl.SelfLink
	o := s.newOperation(r, g.project, g.zone, opSetInstanceTemplate, g.selfLink(), g.id)
	return s.answer(o), nil
}

// listManagedInstances answers the group's instances with their status and
// the action the group is taking on each.
func (s *server) listManagedInstances(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	g, err := s.lookupGroup(r)
	if err != nil {
		return nil, err
	}
	var entries []pageEntry[*instance]
	for _, in := range s.groupInstances(g) {
		entries = append(entries, pageEntry[*instance]{name: in.name, zone: in.zone, item: in})
	}
	page, next, err := paginate(entries, r.URL.Query())
	if err != nil {
		return nil, err
	}
	resp := &compute.InstanceGroupManagersListManagedInstancesResponse{NextPageToken: next}
	for _, e := range page {
		status := s.status(e.item, now)
		resp.ManagedInstances = append(resp.ManagedInstances, &compute.ManagedInstance{
			Instance: e.item.selfLink(), Name: e.item.name, Id: e.item.id,
			InstanceStatus: status, CurrentAction: currentAction(status),
			Version: &compute.ManagedInstanceVersion{InstanceTemplate: e.item.template},
		})
	}
	return resp, nil
}

// currentAction is what the group is doing to an instance in this status.
func currentAction(status string) string {
	switch status {
	case "PROVISIONING", "STAGING":
		return "CREATING"
	case "STOPPING":
		return "DELETING"
	}
	return "NONE"
}
