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

// failRule applies to the next Count requests whose path contains Path (and
// whose method is Method, when one is given).
// An empty Path matches ARM calls only, so that a token fetch does not use up
// a failure meant for the call after it; a non-empty one matches any request
// outside /fake/ (so the token endpoints can be failed too). ARM paths are
// matched in their canonical casing.
type failRule struct {
	Mode   string `json:"mode"`
	Status int    `json:"status,omitempty"`
	Count  int    `json:"count"`
	Path   string `json:"path"`
	Method string `json:"method,omitempty"`
}

func (rule *failRule) matches(method, path string) bool {
	if rule.Method != "" && !strings.EqualFold(rule.Method, method) {
		return false
	}
	if rule.Path == "" {
		return isARM(path)
	}
	return !strings.HasPrefix(path, "/fake/") && strings.Contains(path, rule.Path)
}

// addRule handles POST /fake/<mode>?status=503&count=N&path=SUBSTRING&method=M
// (count defaults to 1; status to 503, unused by hang).
func (s *server) addRule(mode string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rule := &failRule{Mode: mode, Status: http.StatusServiceUnavailable, Count: 1, Path: q.Get("path"), Method: q.Get("method")}
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
		if rule.matches(r.Method, r.URL.Path) {
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

// controlVM finds the VM a /fake/vms/{vmss}/{instance}/... path names, or
// answers 404 itself.
func (s *server) controlVM(w http.ResponseWriter, r *http.Request) (*scaleSet, *vm) {
	name, id := r.PathValue("vmss"), r.PathValue("instance")
	if set := s.sets[strings.ToLower(name)]; set != nil {
		if v := set.vmByInstanceID(id); v != nil {
			return set, v
		}
	}
	writeARMError(w, errNotFound("No VM %s in a scale set named %s.", id, name))
	return nil, nil
}

// setVMState handles POST /fake/vms/{vmss}/{instance}/state?provisioning=Failed&power=stopped
// (either or both): the VM reports them from now on (until it is deleted).
func (s *server) setVMState(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("provisioning") == "" && q.Get("power") == "" {
		http.Error(w, "want ?provisioning=STATE and/or &power=POWER", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.lockedNow()
	set, v := s.controlVM(w, r)
	if v == nil {
		return
	}
	if p := q.Get("provisioning"); p != "" {
		v.provisioning = p
	}
	if p := q.Get("power"); p != "" {
		v.power = p
	}
	writeJSON(w, http.StatusOK, s.instanceView(set, v, now))
}

// vanishVM handles POST /fake/vms/{vmss}/{instance}/delete: the VM is gone
// at once, its scale set's capacity unchanged.
func (s *server) vanishVM(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedNow()
	set, v := s.controlVM(w, r)
	if v == nil {
		return
	}
	delete(set.vms, v.instanceID)
	writeJSON(w, http.StatusOK, map[string]any{"deleted": set.id() + "/virtualMachines/" + strconv.Itoa(v.instanceID)})
}

// failOperation handles POST /fake/operations/{op}/fail?code=C&message=M: the
// operation ends Failed, now if it still runs, with that error (default InternalExecutionError); what
// the call that started it changed stays changed.
func (s *server) failOperation(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	failure := &errorBody{Code: q.Get("code"), Message: q.Get("message")}
	if failure.Code == "" {
		failure.Code = "InternalExecutionError"
	}
	if failure.Message == "" {
		failure.Message = "An internal execution error occurred. Please retry later."
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.operations[r.PathValue("op")]
	if o == nil {
		writeARMError(w, errNotFound("The operation '%s' was not found.", r.PathValue("op")))
		return
	}
	o.failure = failure
	if now := time.Now(); now.Before(s.opEnd(o)) {
		o.failedAt = now // It ends now.
	}
	writeJSON(w, http.StatusOK, operationStatus{Name: o.id, Status: s.opStatus(o, time.Now()),
		StartTime: timestamp(o.created), Error: failure})
}

// issuedToken is one entry of GET /fake/tokens.
type issuedToken struct {
	Token     string    `json:"token"`
	Kind      string    `json:"kind"` // aad-secret, aad-federated, mi
	ClientID  string    `json:"clientId"`
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// listTokens answers the issued tokens and the Authorization header of every
// ARM call ("" when it had none), in order.
func (s *server) listTokens(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"issued":        append([]*issuedToken{}, s.tokens...),
		"authorization": append([]string{}, s.authHeaders...),
	})
}
