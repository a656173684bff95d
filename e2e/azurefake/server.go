package main

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// server holds all fake state behind one mutex; handlers lock it themselves.
type server struct {
	cfg config
	mux *http.ServeMux

	mu          sync.Mutex
	sets        map[string]*scaleSet  // lower-case name; names are unique across resource groups
	operations  map[string]*operation // operation id
	rules       []*failRule
	requests    []requestRecord
	tokens      []*issuedToken
	authHeaders []string

	logMu sync.Mutex
}

func newServer(cfg config) *server {
	s := &server{cfg: cfg, sets: map[string]*scaleSet{}, operations: map[string]*operation{}}
	s.mux = s.routes()
	return s
}

func (s *server) routes() *http.ServeMux {
	m := http.NewServeMux()
	sets := "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets"
	vmss := sets + "/{vmss}"
	vm := vmss + "/virtualMachines/{instance}"
	loc := "/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}"
	m.HandleFunc("GET "+sets, s.arm(s.listScaleSets))
	m.HandleFunc("PUT "+vmss, s.arm(s.createScaleSet))
	m.HandleFunc("GET "+vmss, s.arm(s.getScaleSet))
	m.HandleFunc("PATCH "+vmss, s.arm(s.updateScaleSet))
	m.HandleFunc("POST "+vmss+"/delete", s.arm(s.deleteInstances))
	m.HandleFunc("GET "+vmss+"/virtualMachines", s.arm(s.listVMs))
	m.HandleFunc("GET "+vm, s.arm(s.getVM))
	m.HandleFunc("GET "+vm+"/instanceView", s.arm(s.getInstanceView))
	m.HandleFunc("GET "+loc+"/operations/{op}", s.arm(s.getOperation))
	m.HandleFunc("GET "+loc+"/operationResults/{op}", s.arm(s.getOperationResult))

	m.HandleFunc("POST /{tenant}/oauth2/v2.0/token", s.aadToken)
	m.HandleFunc("GET /metadata/identity/oauth2/token", s.imdsToken)

	m.HandleFunc("POST /fake/fail", s.addRule(modeFail))
	m.HandleFunc("POST /fake/fail-after", s.addRule(modeFailAfter))
	m.HandleFunc("POST /fake/hang", s.addRule(modeHang))
	m.HandleFunc("POST /fake/clear-failures", s.clearRules)
	m.HandleFunc("GET /fake/requests", s.listRequests)
	m.HandleFunc("GET /fake/tokens", s.listTokens)
	m.HandleFunc("POST /fake/vms/{vmss}/{instance}/state", s.setVMState)
	m.HandleFunc("POST /fake/vms/{vmss}/{instance}/delete", s.vanishVM)
	m.HandleFunc("POST /fake/operations/{op}/fail", s.failOperation)
	return m
}

// armFunc is an ARM handler: it writes its answer, or returns the error to
// answer instead (an *armError chooses the status; anything else is a 500).
type armFunc func(w http.ResponseWriter, r *http.Request) error

// arm wraps an ARM handler: every ARM call must name an api-version (any
// value is accepted).
func (s *server) arm(fn armFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := error(errMissingAPIVersion())
		if r.URL.Query().Get("api-version") != "" {
			err = fn(w, r)
		}
		if err != nil {
			writeARMError(w, asARMError(err))
		}
	}
}

// ServeHTTP wraps every request: ARM paths' keywords are matched
// case-insensitively, then come the bearer-token check on ARM calls, the
// injected failures, the request record and log line. The answer is buffered
// so that a failure injected after the fact can replace it.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	routed := r
	if isARM(r.URL.Path) {
		routed = withPath(r, canonicalPath(r.URL.Path))
	}
	buf := newBufferedResponse()
	injected := s.handle(buf, routed)
	if isARM(routed.URL.Path) {
		setHeader(buf, "x-ms-request-id", newUUID())
	}
	s.record(r, buf.status, injected, start)
	if injected == modeHang {
		// Hold the answer so the client times out; stop early if it hangs up
		// (noticed only once the body has been read to its end).
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(60 * time.Second):
		case <-r.Context().Done():
		}
	}
	buf.copyTo(w)
}

// withPath is r with another URL path.
func withPath(r *http.Request, path string) *http.Request {
	c := *r
	u := *r.URL
	u.Path, u.RawPath = path, ""
	c.URL = &u
	return &c
}

// handle runs one request into buf and says which injected failure, if any,
// shaped the answer.
func (s *server) handle(buf *bufferedResponse, r *http.Request) string {
	if isARM(r.URL.Path) {
		if err := s.authorize(r); err != nil {
			writeARMError(buf, err)
			return ""
		}
	}
	rule := s.takeRule(r)
	if rule == nil {
		s.route(buf, r)
		return ""
	}
	if rule.Mode == modeFail {
		writeARMError(buf, injectedError(rule.Status))
		return rule.Mode
	}
	s.route(buf, r)
	if rule.Mode == modeFailAfter {
		buf.reset()
		writeARMError(buf, injectedError(rule.Status))
	}
	return rule.Mode
}

// route serves r; an ARM path (or method) the fake does not know gets ARM's
// envelope rather than the mux's plain-text 404 or 405.
func (s *server) route(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern == "" && isARM(r.URL.Path) {
		writeARMError(w, errNotFound("The fake has no %s %s.", r.Method, r.URL.Path))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// requestRecord is one entry of GET /fake/requests.
type requestRecord struct {
	Time     string `json:"time"`
	Method   string `json:"method"`
	Path     string `json:"path"`
	Query    string `json:"query"`
	Status   int    `json:"status"`
	Injected string `json:"injected,omitempty"` // fail, fail-after or hang
}

// record keeps the request for /fake/requests (not the control calls
// themselves) and appends its line to the -log file.
func (s *server) record(r *http.Request, status int, injected string, start time.Time) {
	rec := requestRecord{
		Time: start.UTC().Format(time.RFC3339Nano), Method: r.Method,
		Path: r.URL.Path, Query: r.URL.RawQuery, Status: status, Injected: injected,
	}
	if !strings.HasPrefix(r.URL.Path, "/fake/") {
		s.mu.Lock()
		s.requests = append(s.requests, rec)
		s.mu.Unlock()
	}
	if s.cfg.logFile == nil {
		return
	}
	entry := map[string]any{
		"time": rec.Time, "method": rec.Method, "path": r.URL.RequestURI(), "status": status,
		"ms": time.Since(start).Milliseconds(),
	}
	if injected != "" {
		entry["injected"] = injected
	}
	line, _ := json.Marshal(entry)
	s.logMu.Lock()
	defer s.logMu.Unlock()
	_, _ = s.cfg.logFile.Write(append(line, '\n'))
}

// bufferedResponse is an http.ResponseWriter kept in memory until copyTo.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func newBufferedResponse() *bufferedResponse {
	return &bufferedResponse{header: http.Header{}, status: http.StatusOK}
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if !b.wrote {
		b.status, b.wrote = status, true
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

func (b *bufferedResponse) reset() {
	b.header, b.status, b.wrote = http.Header{}, http.StatusOK, false
	b.body.Reset()
}

func (b *bufferedResponse) copyTo(w http.ResponseWriter) {
	maps.Copy(w.Header(), b.header)
	w.Header().Set("Content-Length", strconv.Itoa(b.body.Len()))
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// setHeader sets a header in the exact casing ARM writes it (HTTP headers are
// case-insensitive, but a log or a strict client sees the difference).
func setHeader(w http.ResponseWriter, key, value string) {
	h := w.Header()
	h.Del(key)
	h[key] = []string{value}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// decodeBody reads a JSON request body into v (through the model's own
// UnmarshalJSON); ARM answers a malformed body with 400 InvalidRequestContent.
func decodeBody(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		return &armError{status: http.StatusBadRequest, code: "InvalidRequestContent",
			message: "The request content was invalid and could not be deserialized: " + err.Error()}
	}
	return nil
}
