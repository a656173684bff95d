package main

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Failure modes of /fake/fail, /fake/fail-after and /fake/hang.
const (
	modeFail      = "fail"       // answer the error, do nothing
	modeFailAfter = "fail-after" // carry the request out, answer the error instead
	modeHang      = "hang"       // carry it out, hold the answer 60 s
)

// failRule applies to the next Count requests whose path contains Path.
// An empty Path matches compute calls only, so that a token fetch does not
// use up a failure meant for the call after it; a non-empty one matches any
// request outside /fake/ (so /token can be failed too).
type failRule struct {
	Mode   string `json:"mode"`
	Status int    `json:"status,omitempty"`
	Count  int    `json:"count"`
	Path   string `json:"path"`
}

func (rule *failRule) matches(path string) bool {
	if rule.Path == "" {
		return strings.HasPrefix(path, "/compute/v1/")
	}
	return !strings.HasPrefix(path, "/fake/") && strings.Contains(path, rule.Path)
}

// addRule handles POST /fake/<mode>?status=503&count=N&path=SUBSTRING
// (count defaults to 1; status to 503, unused by hang).
func (s *server) addRule(mode string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rule := &failRule{Mode: mode, Status: http.StatusServiceUnavailable, Count: 1, Path: q.Get("path")}
		if v := q.Get("status"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 400 || n > 599 {
				http.Error(w, "status must be 400-599", http.StatusBadRequest)
				return
			}
			rule.Status = n
		}
		if v := q.Get("count"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				http.Error(w, "count must be a positive number", http.StatusBadRequest)
				return
			}
			rule.Count = n
		}
		if mode == modeHang {
			rule.Status = 0
		}
		s.mu.Lock()
		s.rules = append(s.rules, rule)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, rule)
	}
}

// takeRule uses up one application of the first rule matching the request.
func (s *server) takeRule(r *http.Request) *failRule {
	if strings.HasPrefix(r.URL.Path, "/fake/") {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, rule := range s.rules {
		if rule.matches(r.URL.Path) {
			rule.Count--
			if rule.Count == 0 {
				s.rules = append(s.rules[:i], s.rules[i+1:]...)
			}
			return rule
		}
	}
	return nil
}

func (s *server) clearRules(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.rules = nil
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{})
}

// listRequests answers every request handled so far except control calls.
func (s *server) listRequests(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, append([]requestRecord{}, s.requests...))
}

// setInstanceStatus handles POST /fake/instances/{zone}/{name}/status?to=STATUS:
// the instance reports STATUS from now on (until it is deleted).
func (s *server) setInstanceStatus(w http.ResponseWriter, r *http.Request) {
	to := r.URL.Query().Get("to")
	if to == "" {
		http.Error(w, "missing ?to=STATUS", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	in := s.findInstance(r.PathValue("zone"), r.PathValue("name"))
	if in == nil {
		writeAPIError(w, errNotFound("zones/"+r.PathValue("zone")+"/instances/"+r.PathValue("name")))
		return
	}
	in.override = to
	writeJSON(w, http.StatusOK, s.instanceView(in, now))
}

// vanishInstance handles POST /fake/instances/{zone}/{name}/delete: the
// instance and its disk are gone at once, its group's target size unchanged.
func (s *server) vanishInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedNow()
	in := s.findInstance(r.PathValue("zone"), r.PathValue("name"))
	if in == nil {
		writeAPIError(w, errNotFound("zones/"+r.PathValue("zone")+"/instances/"+r.PathValue("name")))
		return
	}
	delete(s.instances, in.key())
	writeJSON(w, http.StatusOK, map[string]any{"deleted": in.selfLink()})
}

// findInstance looks an instance up by zone and name in any project.
func (s *server) findInstance(zone, name string) *instance {
	for _, in := range s.instances {
		if in.zone == zone && in.name == name {
			return in
		}
	}
	return nil
}

// issuedToken is one entry of GET /fake/tokens.
type issuedToken struct {
	Token     string    `json:"token"`
	Kind      string    `json:"kind"`    // sa (JWT bearer), user (refresh token), md (metadata server)
	Subject   string    `json:"subject"` // the JWT's iss, the client_id, or "default"
	Scope     string    `json:"scope,omitempty"`
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// listTokens answers the issued tokens and the Authorization header of every
// compute call ("" when it had none), in order.
func (s *server) listTokens(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"issued":        append([]*issuedToken{}, s.tokens...),
		"authorization": append([]string{}, s.authHeaders...),
	})
}
