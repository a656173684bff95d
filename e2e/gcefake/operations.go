package main

import (
	"net/http"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// operation is a stored Operation; its status is derived from its age: RUNNING
// until -op-delay has passed, then DONE (with its error, if any).
type operation struct {
	view    compute.Operation // the fields that never change
	created time.Time
	errs    []*compute.OperationErrorErrors
	errCode int // httpErrorStatusCode when errs is set
}

// operationScope is "global" or "zones/<zone>", as in the operation's path.
func operationScope(zone string) string {
	if zone == "" {
		return "global"
	}
	return "zones/" + zone
}

// newOperation records an operation on target (zone "" for a global one),
// under the request's requestId too if it has one.
func (s *server) newOperation(r *http.Request, project, zone, opType, target string, targetID uint64) *operation {
	now := time.Now()
	name := operationName(now)
	scope := operationScope(zone)
	o := &operation{created: now, view: compute.Operation{
		Kind: "compute#operation", Id: s.newID(), Name: name, OperationType: opType,
		TargetLink: target, TargetId: targetID, User: s.callerEmail(r),
		InsertTime: timestamp(now), StartTime: timestamp(now),
		SelfLink: link("projects/" + project + "/" + scope + "/operations/" + name),
	}}
	if zone != "" {
		o.view.Zone = link(zonePath(project, zone))
	}
	if id := r.URL.Query().Get("requestId"); id != "" {
		o.view.ClientOperationId = id
		s.byRequestID[project+"/"+id] = o
	}
	s.operations[project+"/"+scope+"/"+name] = o
	return o
}

// fail makes the operation end DONE with these errors instead of succeeding.
func (o *operation) fail(httpCode int, errs ...*compute.OperationErrorErrors) {
	o.errCode, o.errs = httpCode, errs
}

// snapshot is the operation as a client reads it at now.
func (s *server) snapshot(o *operation, now time.Time) *compute.Operation {
	v := o.view
	v.ForceSendFields = []string{"Progress"}
	done := o.created.Add(s.cfg.opDelay)
	if now.Before(done) {
		v.Status, v.Progress = "RUNNING", 0
		return &v
	}
	v.Status, v.Progress, v.EndTime = "DONE", 100, timestamp(done)
	if len(o.errs) > 0 {
		v.Error = &compute.OperationError{Errors: o.errs}
		v.HttpErrorStatusCode = int64(o.errCode)
		v.HttpErrorMessage = httpErrorMessage(o.errCode)
	}
	return &v
}

// answer is the operation as the call that made it answers: RUNNING, or DONE
// at once when -op-delay is 0.
func (s *server) answer(o *operation) *compute.Operation { return s.snapshot(o, o.created) }

// httpErrorMessage is GCE's spelling: "CONFLICT", "BAD REQUEST", ...
func httpErrorMessage(code int) string {
	switch code {
	case http.StatusConflict:
		return "CONFLICT"
	case http.StatusBadRequest:
		return "BAD REQUEST"
	case http.StatusNotFound:
		return "NOT FOUND"
	}
	return http.StatusText(code)
}

// replay answers a repeated requestId with the operation the first request
// made (and does nothing else); nil, nil when the request is new.
func (s *server) replay(project string, r *http.Request) (*compute.Operation, error) {
	id := r.URL.Query().Get("requestId")
	if id == "" {
		return nil, nil
	}
	if err := checkRequestID(id); err != nil {
		return nil, err
	}
	if o := s.byRequestID[project+"/"+id]; o != nil {
		return s.snapshot(o, time.Now()), nil
	}
	return nil, nil
}

// lookupOperation finds the operation a global or zonal operations path names.
func (s *server) lookupOperation(r *http.Request) (*operation, error) {
	project, zone, name := s.project(r), r.PathValue("zone"), r.PathValue("op")
	scope := operationScope(zone)
	if o := s.operations[project+"/"+scope+"/"+name]; o != nil {
		return o, nil
	}
	return nil, errNotFound("projects/" + project + "/" + scope + "/operations/" + name)
}

func (s *server) getOperation(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.lookupOperation(r)
	if err != nil {
		return nil, err
	}
	return s.snapshot(o, time.Now()), nil
}

// waitOperation blocks until the operation is DONE or two minutes have passed
// (GCE's limit), then answers it as it is.
func (s *server) waitOperation(r *http.Request) (any, error) {
	s.mu.Lock()
	o, err := s.lookupOperation(r)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	until := min(time.Until(o.created.Add(s.cfg.opDelay)), 2*time.Minute)
	if until > 0 {
		select {
		case <-time.After(until):
		case <-r.Context().Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot(o, time.Now()), nil
}
