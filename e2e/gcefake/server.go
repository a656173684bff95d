package main

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// server holds all fake state behind one mutex. Handlers lock it themselves
// (operation waits must not hold it while they sleep).
type server struct {
	cfg config
	mux *http.ServeMux

	mu           sync.Mutex
	firstProject string                               // answers for the project number
	templates    map[string]*compute.InstanceTemplate // "project/name"
	groups       map[string]*group                    // "project/zone/name"
	instances    map[string]*instance                 // "project/zone/name"
	operations   map[string]*operation                // "project/scope/name"
	byRequestID  map[string]*operation                // "project/requestId"
	rules        []*failRule
	requests     []requestRecord
	tokens       []*issuedToken
	authHeaders  []string
	seq          uint64 // ids, IPs and token numbers

	logMu sync.Mutex
}

func newServer(cfg config) *server {
	s := &server{
		cfg:         cfg,
		templates:   map[string]*compute.InstanceTemplate{},
		groups:      map[string]*group{},
		instances:   map[string]*instance{},
		operations:  map[string]*operation{},
		byRequestID: map[string]*operation{},
		// Ids look like GCE's 19-digit ones, distinct across fake restarts.
		seq: 4_000_000_000_000_000_000 + rand.Uint64N(1_000_000_000_000_000),
	}
	s.mux = s.routes()
	return s
}

func (s *server) routes() *http.ServeMux {
	m := http.NewServeMux()
	p := "/compute/v1/projects/{project}"
	z := p + "/zones/{zone}"
	igm := z + "/instanceGroupManagers/{igm}"
	m.HandleFunc("GET "+p, s.api(s.getProject))
	m.HandleFunc("POST "+p+"/global/instanceTemplates", s.api(s.insertTemplate))
	m.HandleFunc("GET "+p+"/global/instanceTemplates/{template}", s.api(s.getTemplate))
	m.HandleFunc("GET "+p+"/global/operations/{op}", s.api(s.getOperation))
	m.HandleFunc("POST "+p+"/global/operations/{op}/wait", s.api(s.waitOperation))
	m.HandleFunc("GET "+p+"/aggregated/instanceGroupManagers", s.api(s.aggregatedGroups))
	m.HandleFunc("GET "+p+"/aggregated/instances", s.api(s.aggregatedInstances))
	m.HandleFunc("POST "+z+"/instanceGroupManagers", s.api(s.insertGroup))
	m.HandleFunc("GET "+igm, s.api(s.getGroup))
	m.HandleFunc("POST "+igm+"/createInstances", s.api(s.createInstances))
	m.HandleFunc("POST "+igm+"/deleteInstances", s.api(s.deleteInstances))
	m.HandleFunc("POST "+igm+"/setInstanceTemplate", s.api(s.setInstanceTemplate))
	m.HandleFunc("POST "+igm+"/listManagedInstances", s.api(s.listManagedInstances))
	m.HandleFunc("GET "+z+"/instances", s.api(s.listInstances))
	m.HandleFunc("GET "+z+"/instances/{instance}", s.api(s.getInstance))
	m.HandleFunc("GET "+z+"/disks/{disk}", s.api(s.getDisk))
	m.HandleFunc("GET "+z+"/operations/{op}", s.api(s.getOperation))
	m.HandleFunc("POST "+z+"/operations/{op}/wait", s.api(s.waitOperation))
	m.HandleFunc("/compute/v1/", s.api(unknownResource))

	m.HandleFunc("POST /token", s.oauthToken)
	m.HandleFunc("GET /computeMetadata/v1/instance/service-accounts/default/token", s.metadataToken)
	m.HandleFunc("GET /computeMetadata/v1/project/project-id", s.metadataProjectID)

	m.HandleFunc("POST /fake/fail", s.addRule(modeFail))
	m.HandleFunc("POST /fake/fail-after", s.addRule(modeFailAfter))
	m.HandleFunc("POST /fake/hang", s.addRule(modeHang))
	m.HandleFunc("POST /fake/clear-failures", s.clearRules)
	m.HandleFunc("GET /fake/requests", s.listRequests)
	m.HandleFunc("GET /fake/tokens", s.listTokens)
	m.HandleFunc("POST /fake/instances/{zone}/{name}/status", s.setInstanceStatus)
	m.HandleFunc("POST /fake/instances/{zone}/{name}/delete", s.vanishInstance)
	return m
}

// apiFunc is a compute handler: the value to answer with, or an error
// (an *apiError chooses the status; anything else is a 500).
type apiFunc func(r *http.Request) (any, error)

func (s *server) api(fn apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := fn(r)
		if err != nil {
			writeAPIError(w, asAPIError(err))
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

func unknownResource(r *http.Request) (any, error) {
	return nil, errNotFound(strings.TrimPrefix(r.URL.Path, "/compute/v1/"))
}

// ServeHTTP wraps every request: the bearer-token check on compute calls, the
// injected failures, the request record and log line. The answer is buffered
// so that a failure injected after the fact can replace it.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	buf := newBufferedResponse()
	injected := s.handle(buf, r)
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

// handle runs one request into buf and says which injected failure, if any,
// shaped the answer.
func (s *server) handle(buf *bufferedResponse, r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/compute/v1/") {
		if err := s.authorize(r); err != nil {
			writeAPIError(buf, asAPIError(err))
			return ""
		}
	}
	rule := s.takeRule(r)
	if rule == nil {
		s.mux.ServeHTTP(buf, r)
		return ""
	}
	if rule.Mode == modeFail {
		writeAPIError(buf, injectedError(rule.Status))
		return rule.Mode
	}
	s.mux.ServeHTTP(buf, r)
	if rule.Mode == modeFailAfter {
		buf.reset()
		writeAPIError(buf, injectedError(rule.Status))
	}
	return rule.Mode
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// decodeBody reads a JSON request body into v; GCE answers a malformed body
// with 400 parseError.
func decodeBody(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		return &apiError{status: http.StatusBadRequest, reason: "parseError",
			message: "Invalid JSON payload received. " + err.Error()}
	}
	return nil
}
