package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	compute "google.golang.org/api/compute/v1"
)

const (
	testProject = "proj"
	testZone    = "europe-west1-b"
	zoneBase    = "/compute/v1/projects/" + testProject + "/zones/" + testZone
	groupBase   = zoneBase + "/instanceGroupManagers/workers"
	image1      = "projects/debian-cloud/global/images/debian-12-v1"
	image2      = "https://www.googleapis.com/compute/v1/projects/debian-cloud/global/images/debian-12-v2"
)

// fake is a test's server and its client helpers.
type fake struct {
	t   *testing.T
	url string
}

func startFake(t *testing.T, adjust func(*config)) *fake {
	t.Helper()
	// Long enough that a loaded machine still sees the early states.
	cfg := config{boot: 500 * time.Millisecond, stop: 300 * time.Millisecond,
		opDelay: 50 * time.Millisecond, projectNumber: 123456789012, tokenTTL: time.Hour}
	if adjust != nil {
		adjust(&cfg)
	}
	srv := httptest.NewServer(newServer(cfg))
	t.Cleanup(srv.Close)
	return &fake{t: t, url: srv.URL}
}

// do sends body (JSON unless it is url.Values) and decodes the answer into out
// (when not nil); it returns the status.
func (f *fake) do(method, path string, body, out any, header ...string) int {
	f.t.Helper()
	var rd io.Reader
	contentType := "application/json"
	switch b := body.(type) {
	case nil:
	case url.Values:
		rd, contentType = strings.NewReader(b.Encode()), "application/x-www-form-urlencoded"
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, f.url+path, rd)
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

// must is do, failing the test unless the status is want.
func (f *fake) must(want int, method, path string, body, out any, header ...string) {
	f.t.Helper()
	var raw json.RawMessage
	if got := f.do(method, path, body, &raw, header...); got != want {
		f.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			f.t.Fatal(err)
		}
	}
}

// wait polls the zonal operation until DONE.
func (f *fake) wait(op *compute.Operation) *compute.Operation {
	f.t.Helper()
	var done compute.Operation
	f.must(200, "POST", zoneBase+"/operations/"+op.Name+"/wait", nil, &done)
	if done.Status != "DONE" {
		f.t.Fatalf("operation %s: %s after wait", op.Name, done.Status)
	}
	return &done
}

func (f *fake) insertTemplate(name, image string) *compute.Operation {
	f.t.Helper()
	tmpl := compute.InstanceTemplate{Name: name, Properties: &compute.InstanceProperties{
		MachineType: "e2-small", Labels: map[string]string{"nodewarden-pool": "workers"},
		Disks: []*compute.AttachedDisk{{Boot: true, InitializeParams: &compute.AttachedDiskInitializeParams{SourceImage: image}}},
	}}
	var op compute.Operation
	f.must(200, "POST", "/compute/v1/projects/"+testProject+"/global/instanceTemplates", tmpl, &op)
	return &op
}

// setupGroup makes template t1 and group "workers" of size in testZone.
func (f *fake) setupGroup(size int64) {
	f.t.Helper()
	f.insertTemplate("t1", image1)
	igm := compute.InstanceGroupManager{Name: "workers", BaseInstanceName: "w",
		InstanceTemplate: "global/instanceTemplates/t1", TargetSize: size}
	var op compute.Operation
	f.must(200, "POST", zoneBase+"/instanceGroupManagers", igm, &op)
	f.wait(&op)
}

func (f *fake) managed() []*compute.ManagedInstance {
	f.t.Helper()
	var resp compute.InstanceGroupManagersListManagedInstancesResponse
	f.must(200, "POST", groupBase+"/listManagedInstances", nil, &resp)
	return resp.ManagedInstances
}

func (f *fake) targetSize() int64 {
	f.t.Helper()
	var igm compute.InstanceGroupManager
	f.must(200, "GET", groupBase, nil, &igm)
	return igm.TargetSize
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestTemplateAndGroup(t *testing.T) {
	f := startFake(t, nil)
	op := f.insertTemplate("t1", image1)
	if op.Status != "RUNNING" || op.OperationType != "insert" ||
		op.TargetLink != "https://www.googleapis.com/compute/v1/projects/proj/global/instanceTemplates/t1" {
		t.Fatalf("template insert operation: %+v", op)
	}
	var got compute.Operation
	eventually(t, "global operation DONE", func() bool {
		f.must(200, "GET", "/compute/v1/projects/proj/global/operations/"+op.Name, nil, &got)
		return got.Status == "DONE"
	})
	var env errorEnvelope
	if f.do("POST", "/compute/v1/projects/proj/global/instanceTemplates",
		compute.InstanceTemplate{Name: "t1"}, &env) != 409 || env.Error.Errors[0].Reason != "alreadyExists" {
		t.Fatalf("duplicate template: %+v", env)
	}

	igm := compute.InstanceGroupManager{Name: "workers", BaseInstanceName: "w",
		InstanceTemplate: "projects/proj/global/instanceTemplates/t1", TargetSize: 2}
	op = new(compute.Operation)
	f.must(200, "POST", zoneBase+"/instanceGroupManagers", igm, op)
	if op.Zone != "https://www.googleapis.com/compute/v1/projects/proj/zones/europe-west1-b" || op.Status != "RUNNING" {
		t.Fatalf("group insert operation: %+v", op)
	}
	var view compute.InstanceGroupManager
	f.must(200, "GET", groupBase, nil, &view)
	if view.TargetSize != 2 || view.InstanceTemplate != got.TargetLink || view.BaseInstanceName != "w" {
		t.Fatalf("group: %+v", view)
	}
	checkNewInstances(t, f)
}

// checkNewInstances checks the two instances setupGroup-like calls made.
func checkNewInstances(t *testing.T, f *fake) {
	managed := f.managed()
	if len(managed) != 2 {
		t.Fatalf("managed instances: %d", len(managed))
	}
	m := managed[0]
	if !regexp.MustCompile(`^w-[a-z0-9]{4}$`).MatchString(m.Name) || m.CurrentAction != "CREATING" {
		t.Fatalf("managed instance: %+v", m)
	}
	var in compute.Instance
	f.must(200, "GET", zoneBase+"/instances/"+m.Name, nil, &in)
	meta := map[string]string{}
	for _, item := range in.Metadata.Items {
		meta[item.Key] = *item.Value
	}
	if meta["created-by"] != "projects/123456789012/zones/europe-west1-b/instanceGroupManagers/workers" ||
		in.Labels["nodewarden-pool"] != "workers" || !strings.HasPrefix(in.NetworkInterfaces[0].NetworkIP, "10.") ||
		in.Disks[0].Source != "https://www.googleapis.com/compute/v1/projects/proj/zones/europe-west1-b/disks/"+m.Name ||
		in.Id != m.Id || in.SelfLink != m.Instance {
		t.Fatalf("instance: %+v meta %v", in, meta)
	}
	var disk compute.Disk
	f.must(200, "GET", zoneBase+"/disks/"+m.Name, nil, &disk)
	if disk.SourceImage != image1 {
		t.Fatalf("disk: %+v", disk)
	}
	eventually(t, "instance RUNNING", func() bool {
		f.must(200, "GET", zoneBase+"/instances/"+m.Name, nil, &in)
		return in.Status == "RUNNING" && f.managed()[0].CurrentAction == "NONE"
	})
}

func TestProjectByNameAndNumber(t *testing.T) {
	f := startFake(t, nil)
	if got := f.do("GET", "/compute/v1/projects/123456789012", nil, nil); got != 404 {
		t.Fatalf("number before any name: %d", got)
	}
	var p compute.Project
	f.must(200, "GET", "/compute/v1/projects/proj", nil, &p)
	if p.Name != "proj" || p.Id != 123456789012 {
		t.Fatalf("project: %+v", p)
	}
	f.must(200, "GET", "/compute/v1/projects/123456789012", nil, &p)
	if p.Name != "proj" {
		t.Fatalf("project by number: %+v", p)
	}
}

func TestCreateInstancesRequestID(t *testing.T) {
	f := startFake(t, nil)
	f.setupGroup(2)
	body := compute.InstanceGroupManagersCreateInstancesRequest{
		Instances: []*compute.PerInstanceConfig{{Name: "w-extra"}}}
	const rid = "5d1c6a4e-8a43-4f43-9d3b-3f4c1f0b2a11"
	var first, second compute.Operation
	f.must(200, "POST", groupBase+"/createInstances?requestId="+rid+"&alt=json&prettyPrint=false", body, &first)
	f.must(200, "POST", groupBase+"/createInstances?requestId="+rid, body, &second)
	if first.Name != second.Name || first.ClientOperationId != rid || first.OperationType != opCreateInstances {
		t.Fatalf("repeated requestId: %+v / %+v", first, second)
	}
	if n := len(f.managed()); n != 3 || f.targetSize() != 3 {
		t.Fatalf("after createInstances: %d instances, target %d", n, f.targetSize())
	}
	var clash compute.Operation
	f.must(200, "POST", groupBase+"/createInstances?requestId=0b9c0a3e-1111-4222-8333-944455556666", body, &clash)
	done := f.wait(&clash)
	if done.Error == nil || done.Error.Errors[0].Code != "RESOURCE_ALREADY_EXISTS" || f.targetSize() != 3 {
		t.Fatalf("existing name: %+v", done)
	}
	if got := f.do("POST", groupBase+"/createInstances?requestId=not-a-uuid", body, nil); got != 400 {
		t.Fatalf("bad requestId: %d", got)
	}
}

func TestDeleteInstances(t *testing.T) {
	f := startFake(t, nil)
	f.setupGroup(2)
	victim := f.managed()[0].Name
	var op compute.Operation
	f.must(200, "POST", groupBase+"/deleteInstances", compute.InstanceGroupManagersDeleteInstancesRequest{
		Instances: []string{"zones/" + testZone + "/instances/" + victim}}, &op)
	var in compute.Instance
	f.must(200, "GET", zoneBase+"/instances/"+victim, nil, &in)
	if in.Status != "STOPPING" || f.targetSize() != 1 || f.managed()[0].CurrentAction != "DELETING" {
		t.Fatalf("deleting: %s, target %d", in.Status, f.targetSize())
	}
	eventually(t, "instance gone", func() bool {
		return f.do("GET", zoneBase+"/instances/"+victim, nil, nil) == 404
	})
	var env errorEnvelope
	if f.do("GET", zoneBase+"/disks/"+victim, nil, &env) != 404 || env.Error.Errors[0].Reason != "notFound" {
		t.Fatalf("disk after delete: %+v", env)
	}
	stranger := "https://www.googleapis.com/compute/v1/projects/proj/zones/" + testZone + "/instances/nope"
	req := compute.InstanceGroupManagersDeleteInstancesRequest{Instances: []string{stranger}}
	if f.do("POST", groupBase+"/deleteInstances", req, &env) != 400 || env.Error.Errors[0].Reason != "invalid" {
		t.Fatalf("non-member: %+v", env)
	}
	req.SkipInstancesOnValidationError = true
	f.must(200, "POST", groupBase+"/deleteInstances", req, &op)
	if f.targetSize() != 1 || len(f.managed()) != 1 {
		t.Fatal("skipped non-member changed the group")
	}
}

func TestAggregatedPaging(t *testing.T) {
	f := startFake(t, nil)
	f.setupGroup(2)
	other := compute.InstanceGroupManager{Name: "others", BaseInstanceName: "o",
		InstanceTemplate: "global/instanceTemplates/t1", TargetSize: 1}
	f.must(200, "POST", "/compute/v1/projects/proj/zones/us-east1-c/instanceGroupManagers", other, nil)

	var names []string
	token, pages := "", 0
	for {
		var list compute.InstanceAggregatedList
		f.must(200, "GET", "/compute/v1/projects/proj/aggregated/instances?maxResults=1&filter=status%3DRUNNING&pageToken="+token, nil, &list)
		pages++
		for scope, scoped := range list.Items {
			for _, in := range scoped.Instances {
				names = append(names, in.Name)
				if !strings.HasSuffix(in.Zone, "/"+scope) {
					t.Fatalf("instance %s of zone %s under %s", in.Name, in.Zone, scope)
				}
			}
		}
		if token = list.NextPageToken; token == "" {
			break
		}
	}
	if pages != 3 || len(names) != 3 || names[0] > names[1] || names[1] > names[2] {
		t.Fatalf("pages %d, names %v", pages, names)
	}
	var groups compute.InstanceGroupManagerAggregatedList
	f.must(200, "GET", "/compute/v1/projects/proj/aggregated/instanceGroupManagers?maxResults=1", nil, &groups)
	if len(groups.Items) != 1 || groups.Items["zones/us-east1-c"].InstanceGroupManagers[0].Name != "others" ||
		groups.NextPageToken == "" {
		t.Fatalf("first page of groups: %+v", groups)
	}
}

func TestSetInstanceTemplateKeepsDisks(t *testing.T) {
	f := startFake(t, nil)
	f.setupGroup(1)
	old := f.managed()[0].Name
	f.insertTemplate("t2", image2)
	var op compute.Operation
	f.must(200, "POST", groupBase+"/setInstanceTemplate", compute.InstanceGroupManagersSetInstanceTemplateRequest{
		InstanceTemplate: "https://www.googleapis.com/compute/v1/projects/proj/global/instanceTemplates/t2"}, &op)
	if f.do("POST", groupBase+"/setInstanceTemplate", compute.InstanceGroupManagersSetInstanceTemplateRequest{
		InstanceTemplate: "global/instanceTemplates/missing"}, nil) != 404 {
		t.Fatal("missing template accepted")
	}
	f.must(200, "POST", groupBase+"/createInstances", compute.InstanceGroupManagersCreateInstancesRequest{
		Instances: []*compute.PerInstanceConfig{{Name: "w-new"}}}, &op)
	var oldDisk, newDisk compute.Disk
	f.must(200, "GET", zoneBase+"/disks/"+old, nil, &oldDisk)
	f.must(200, "GET", zoneBase+"/disks/w-new", nil, &newDisk)
	if oldDisk.SourceImage != image1 || newDisk.SourceImage != image2 {
		t.Fatalf("images: old %s, new %s", oldDisk.SourceImage, newDisk.SourceImage)
	}
}

func TestControlEndpoints(t *testing.T) {
	f := startFake(t, nil)
	f.setupGroup(2)
	name := f.managed()[0].Name
	f.must(200, "POST", "/fake/instances/"+testZone+"/"+name+"/status?to=TERMINATED", nil, nil)
	var in compute.Instance
	f.must(200, "GET", zoneBase+"/instances/"+name, nil, &in)
	if in.Status != "TERMINATED" {
		t.Fatalf("status override: %s", in.Status)
	}
	f.must(200, "POST", "/fake/instances/"+testZone+"/"+name+"/delete", nil, nil)
	if f.do("GET", zoneBase+"/instances/"+name, nil, nil) != 404 || f.targetSize() != 2 || len(f.managed()) != 1 {
		t.Fatal("vanished instance still there, or target size changed")
	}
}

func TestFailureInjection(t *testing.T) {
	f := startFake(t, nil)
	f.must(200, "POST", "/fake/fail?status=503&count=1&path=instanceTemplates", nil, nil)
	var env errorEnvelope
	if f.do("POST", "/compute/v1/projects/proj/global/instanceTemplates", compute.InstanceTemplate{Name: "t1"}, &env) != 503 ||
		env.Error.Errors[0].Reason != "backendError" {
		t.Fatalf("injected failure: %+v", env)
	}
	if f.do("GET", "/compute/v1/projects/proj/global/instanceTemplates/t1", nil, nil) != 404 {
		t.Fatal("failed request was carried out")
	}

	f.must(200, "POST", "/fake/fail-after?status=429&path=instanceTemplates", nil, nil)
	const rid = "11111111-2222-4333-8444-555555555555"
	path := "/compute/v1/projects/proj/global/instanceTemplates?requestId=" + rid
	if f.do("POST", path, compute.InstanceTemplate{Name: "t1"}, &env) != 429 || env.Error.Errors[0].Reason != "rateLimitExceeded" {
		t.Fatalf("fail-after: %+v", env)
	}
	var op compute.Operation
	f.must(200, "POST", path, compute.InstanceTemplate{Name: "t1"}, &op)
	if !strings.HasSuffix(op.TargetLink, "/instanceTemplates/t1") {
		t.Fatalf("retry after a lost answer: %+v", op)
	}

	f.must(200, "POST", "/fake/hang?path=/instanceTemplates", nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/compute/v1/projects/proj/global/instanceTemplates",
		strings.NewReader(`{"name":"t3"}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("hung request answered")
	}
	f.must(200, "GET", "/compute/v1/projects/proj/global/instanceTemplates/t3", nil, nil)

	var records []requestRecord
	f.must(200, "GET", "/fake/requests", nil, &records)
	if len(records) != 6 || records[0].Injected != "fail" || records[2].Injected != "fail-after" || records[4].Injected != "hang" {
		t.Fatalf("requests: %+v", records)
	}
}

// signJWT makes a service account's token request assertion.
func signJWT(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	enc := func(v any) string {
		data, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(data)
	}
	signed := enc(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "k1"}) + "." + enc(claims)
	digest := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestServiceAccountToken(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keyFile := filepath.Join(t.TempDir(), "sa.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := readPublicKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	f := startFake(t, func(c *config) { c.saPublicKey, c.requireToken = pub, true })

	var env errorEnvelope
	if f.do("GET", "/compute/v1/projects/proj", nil, &env) != 401 || env.Error.Errors[0].Reason != "required" {
		t.Fatalf("no token: %+v", env)
	}
	now := time.Now().Unix()
	claims := map[string]any{"iss": "sa@proj.iam.gserviceaccount.com", "aud": f.url + "/token",
		"scope": "https://www.googleapis.com/auth/compute", "iat": now, "exp": now + 3600}
	form := url.Values{"grant_type": {jwtBearerGrant}, "assertion": {signJWT(t, key, claims)}}
	var tok struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int    `json:"expires_in"`
		TokenType   string `json:"token_type"`
	}
	f.must(200, "POST", "/token", form, &tok)
	if tok.AccessToken != "fake-sa-1" || tok.TokenType != "Bearer" {
		t.Fatalf("token: %+v", tok)
	}
	f.must(200, "GET", "/compute/v1/projects/proj", nil, nil, "Authorization", "Bearer "+tok.AccessToken)
	checkBadAssertions(t, f, key, claims)
}

// checkBadAssertions: another audience, an old iat, no compute scope (signed
// with the right key), and the right claims signed with a foreign key.
func checkBadAssertions(t *testing.T, f *fake, key *rsa.PrivateKey, good map[string]any) {
	now := time.Now().Unix()
	variants := map[string]map[string]any{
		"audience": {"aud": "https://example.com/token"},
		"iat":      {"iat": now - 900, "exp": now + 2700},
		"scope":    {"scope": "https://www.googleapis.com/auth/devstorage.read_only"},
	}
	for what, change := range variants {
		claims := maps.Clone(good)
		maps.Copy(claims, change)
		form := url.Values{"grant_type": {jwtBearerGrant}, "assertion": {signJWT(t, key, claims)}}
		var e map[string]string
		if f.do("POST", "/token", form, &e) != 400 || e["error"] != "invalid_grant" {
			t.Fatalf("bad %s accepted: %v", what, e)
		}
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {jwtBearerGrant}, "assertion": {signJWT(t, other, good)}}
	var e map[string]string
	if f.do("POST", "/token", form, &e) != 400 || e["error_description"] != "Invalid JWT Signature." {
		t.Fatalf("foreign key accepted: %v", e)
	}
}

func TestUserAndMetadataTokens(t *testing.T) {
	f := startFake(t, func(c *config) { c.requireToken, c.metadataProject = true, "md-proj" })
	var tok map[string]any
	f.must(400, "POST", "/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {"c"}}, nil)
	f.must(200, "POST", "/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {"c"},
		"client_secret": {"s"}, "refresh_token": {"r"}}, &tok)
	if tok["access_token"] != "fake-user-1" {
		t.Fatalf("user token: %v", tok)
	}
	mdPath := "/computeMetadata/v1/instance/service-accounts/default/token"
	if f.do("GET", mdPath, nil, nil) != 403 {
		t.Fatal("metadata token without Metadata-Flavor")
	}
	f.must(200, "GET", mdPath, nil, &tok, "Metadata-Flavor", "Google")
	if tok["access_token"] != "fake-md-2" || tok["expires_in"] != float64(3600) {
		t.Fatalf("metadata token: %v", tok)
	}
	var wrong errorEnvelope
	if f.do("GET", "/compute/v1/projects/proj", nil, &wrong, "Authorization", "Bearer forged") != 401 ||
		wrong.Error.Errors[0].Reason != "authError" || wrong.Error.Status != "UNAUTHENTICATED" {
		t.Fatalf("forged token: %+v", wrong)
	}
	f.must(200, "GET", "/compute/v1/projects/proj", nil, nil, "Authorization", "Bearer fake-md-2")
	var seen struct {
		Issued        []issuedToken `json:"issued"`
		Authorization []string      `json:"authorization"`
	}
	f.must(200, "GET", "/fake/tokens", nil, &seen)
	if len(seen.Issued) != 2 || seen.Issued[1].Kind != "md" || len(seen.Authorization) != 2 ||
		seen.Authorization[1] != "Bearer fake-md-2" {
		t.Fatalf("/fake/tokens: %+v", seen)
	}
	req, _ := http.NewRequest("GET", f.url+"/computeMetadata/v1/project/project-id", nil)
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "md-proj" || resp.Header.Get("Metadata-Flavor") != "Google" {
		t.Fatalf("project-id: %q %v", body, resp.Header)
	}
}
