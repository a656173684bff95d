package main

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// operation is an asynchronous operation on a scale set; its status is
// derived from its age: InProgress until -op-delay has passed, then Succeeded
// (or Failed, when /fake/operations/{op}/fail said so).
type operation struct {
	id, sub, location string
	created           time.Time
	failure           *errorBody // set by /fake/operations/{op}/fail
	failedAt          time.Time  // when it was failed, if before its end
}

// operationStatus is the body of an Azure-AsyncOperation poll, as compute
// answers it.
type operationStatus struct {
	Name      string     `json:"name"`
	Status    string     `json:"status"`
	StartTime string     `json:"startTime"`
	EndTime   string     `json:"endTime,omitempty"`
	Error     *errorBody `json:"error,omitempty"`
}

// newOperation records an operation on set; the set is Updating until it ends.
func (s *server) newOperation(set *scaleSet, now time.Time) *operation {
	o := &operation{id: newUUID(), sub: set.sub, location: set.location, created: now}
	s.operations[o.id] = o
	if end := s.opEnd(o); end.After(set.busyUntil) {
		set.busyUntil = end
	}
	return o
}

func (s *server) opEnd(o *operation) time.Time {
	if !o.failedAt.IsZero() {
		return o.failedAt
	}
	return o.created.Add(s.cfg.opDelay)
}

func (s *server) opStatus(o *operation, now time.Time) string {
	switch {
	case now.Before(s.opEnd(o)):
		return "InProgress"
	case o.failure != nil:
		return "Failed"
	}
	return "Succeeded"
}

// lroHeaders are the headers of an answer that started o: Azure-AsyncOperation,
// Location too when withLocation (a POST action), and Retry-After.
func (s *server) lroHeaders(w http.ResponseWriter, r *http.Request, o *operation, withLocation bool) {
	setHeader(w, "Azure-AsyncOperation", fakeURL(r, operationPath(o.sub, o.location, "operations", o.id)))
	if withLocation {
		w.Header().Set("Location", fakeURL(r, operationPath(o.sub, o.location, "operationResults", o.id)))
	}
	w.Header().Set("Retry-After", strconv.Itoa(s.cfg.retryAfter))
}

// lookupOperation finds the operation an operations or operationResults path
// names (subscription and location must match, any casing).
func (s *server) lookupOperation(r *http.Request) (*operation, error) {
	o := s.operations[r.PathValue("op")]
	if o == nil || !strings.EqualFold(o.sub, r.PathValue("sub")) || !strings.EqualFold(o.location, r.PathValue("location")) {
		return nil, errNotFound("The operation '%s' was not found.", r.PathValue("op"))
	}
	return o, nil
}

// getOperation is the Azure-AsyncOperation URL: the operation's status, with
// Retry-After while InProgress.
func (s *server) getOperation(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.lookupOperation(r)
	if err != nil {
		return err
	}
	now := time.Now()
	st := operationStatus{Name: o.id, Status: s.opStatus(o, now), StartTime: timestamp(o.created)}
	if st.Status == "InProgress" {
		w.Header().Set("Retry-After", strconv.Itoa(s.cfg.retryAfter))
	} else {
		st.EndTime = timestamp(s.opEnd(o))
	}
	if st.Status == "Failed" {
		st.Error = o.failure
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// getOperationResult is the Location URL: 202 (Location, Retry-After) while
// InProgress, 200 with no body once Succeeded, the operation's error once Failed.
func (s *server) getOperationResult(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.lookupOperation(r)
	if err != nil {
		return err
	}
	switch s.opStatus(o, time.Now()) {
	case "InProgress":
		w.Header().Set("Location", fakeURL(r, operationPath(o.sub, o.location, "operationResults", o.id)))
		w.Header().Set("Retry-After", strconv.Itoa(s.cfg.retryAfter))
		w.WriteHeader(http.StatusAccepted)
	case "Failed":
		return &armError{status: http.StatusInternalServerError, code: o.failure.Code, message: o.failure.Message}
	default:
		w.WriteHeader(http.StatusOK)
	}
	return nil
}
