package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6"
)

const (
	testSub   = "0b1f6471-1bf0-4dda-aec3-cb9272f09590"
	testRG    = "nodes"
	setsPath  = "/subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachineScaleSets"
	vmssPath  = setsPath + "/workers"
	apiV      = "?api-version=2024-07-01"
	image1    = "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0"
	image2    = "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/2.0.0"
	tokenPath = "/tenant-1/oauth2/v2.0/token"
	imdsPath  = "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/"
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
		opDelay: 300 * time.Millisecond, retryAfter: 0, pageSize: 50, tokenTTL: time.Hour}
	if adjust != nil {
		adjust(&cfg)
	}
	srv := httptest.NewServer(newServer(cfg))
	t.Cleanup(srv.Close)
	return &fake{t: t, url: srv.URL}
}

// response is what call got back.
type response struct {
	status int
	header http.Header
	body   []byte
}

// call sends body (JSON unless it is url.Values) to path (relative to the
// fake, or an absolute URL) with header pairs.
func (f *fake) call(method, path string, body any, header ...string) *response {
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
	if !strings.HasPrefix(path, "http") {
		path = f.url + path
	}
	req, _ := http.NewRequest(method, path, rd)
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
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// must is call, failing the test unless the status is want; the body goes
// into out (when not nil).
func (f *fake) must(want int, method, path string, body, out any, header ...string) http.Header {
	f.t.Helper()
	resp := f.call(method, path, body, header...)
	if resp.status != want {
		f.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.status, want, resp.body)
	}
	if out != nil {
		if err := json.Unmarshal(resp.body, out); err != nil {
			f.t.Fatalf("%s %s: %s: %v", method, path, resp.body, err)
		}
	}
	return resp.header
}

// armErr is call expecting an ARM error of that status and code.
func (f *fake) armErr(status int, code, method, path string, body any, header ...string) {
	f.t.Helper()
	resp := f.call(method, path, body, header...)
	var env errorEnvelope
	_ = json.Unmarshal(resp.body, &env)
	if resp.status != status || env.Error.Code != code || resp.header.Get("x-ms-error-code") != code {
		f.t.Fatalf("%s %s: %d %s, want %d %s", method, path, resp.status, resp.body, status, code)
	}
}

// createSet makes scale set name with capacity VMs of image1.
func (f *fake) createSet(name string, capacity int64) *armcompute.VirtualMachineScaleSet {
	f.t.Helper()
	body := armcompute.VirtualMachineScaleSet{
		Location: ptr("West Europe"), Tags: map[string]*string{"pool": ptr("workers")},
		SKU: &armcompute.SKU{Name: ptr("Standard_D2s_v3"), Tier: ptr("Standard"), Capacity: ptr(capacity)},
		Properties: &armcompute.VirtualMachineScaleSetProperties{
			VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{
				OSProfile:      &armcompute.VirtualMachineScaleSetOSProfile{ComputerNamePrefix: ptr("worker")},
				StorageProfile: &armcompute.VirtualMachineScaleSetStorageProfile{ImageReference: &armcompute.ImageReference{ID: ptr(image1)}},
			},
		},
	}
	var set armcompute.VirtualMachineScaleSet
	f.must(201, "PUT", setsPath+"/"+name+apiV, body, &set)
	return &set
}

func (f *fake) getSet() *armcompute.VirtualMachineScaleSet {
	f.t.Helper()
	var set armcompute.VirtualMachineScaleSet
	f.must(200, "GET", vmssPath+apiV, nil, &set)
	return &set
}

// vms lists the VMs of "workers", following nextLink.
func (f *fake) vms() []*armcompute.VirtualMachineScaleSetVM {
	f.t.Helper()
	var all []*armcompute.VirtualMachineScaleSetVM
	for next := vmssPath + "/virtualMachines" + apiV; next != ""; {
		var page armcompute.VirtualMachineScaleSetVMListResult
		f.must(200, "GET", next, nil, &page)
		all = append(all, page.Value...)
		next = deref(page.NextLink)
	}
	return all
}

func (f *fake) patch(body armcompute.VirtualMachineScaleSetUpdate, header ...string) http.Header {
	f.t.Helper()
	return f.must(200, "PATCH", vmssPath+apiV, body, nil, header...)
}

func instanceIDs(vms []*armcompute.VirtualMachineScaleSetVM) string {
	var ids []string
	for _, v := range vms {
		ids = append(ids, *v.InstanceID)
	}
	return strings.Join(ids, ",")
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

func TestCreateAndGet(t *testing.T) {
	f := startFake(t, nil)
	set := f.createSet("workers", 2)
	p := set.Properties
	if *set.ID != vmssPath || *set.Name != "workers" || *set.Type != scaleSetType || *set.Location != "westeurope" ||
		*set.SKU.Capacity != 2 || *set.Etag != `"1"` || *p.ProvisioningState != "Succeeded" ||
		*p.OrchestrationMode != armcompute.OrchestrationModeUniform || p.UniqueID == nil ||
		*p.VirtualMachineProfile.OSProfile.ComputerNamePrefix != "worker" ||
		*p.VirtualMachineProfile.StorageProfile.ImageReference.ID != image1 || *set.Tags["pool"] != "workers" {
		t.Fatalf("created: %s", mustJSON(set))
	}
	// Keywords in any casing; the answer's id in ARM's.
	lower := strings.ToLower(setsPath) + "/workers" + apiV
	var got armcompute.VirtualMachineScaleSet
	hdr := f.must(200, "GET", lower, nil, &got)
	if *got.ID != vmssPath || hdr.Get("x-ms-request-id") == "" {
		t.Fatalf("GET in lower case: %s %v", mustJSON(&got), hdr)
	}
	f.armErr(409, "Conflict", "PUT", vmssPath+apiV, armcompute.VirtualMachineScaleSet{Location: ptr("westeurope")})
	f.armErr(404, "ResourceNotFound", "GET", setsPath+"/nope"+apiV, nil)
	f.armErr(404, "ResourceNotFound", "GET", strings.Replace(vmssPath, testRG, "other", 1)+apiV, nil)
	f.armErr(400, "MissingApiVersionParameter", "GET", vmssPath, nil)
	f.armErr(400, "LocationRequired", "PUT", setsPath+"/noloc"+apiV, armcompute.VirtualMachineScaleSet{})
	f.armErr(404, "NotFound", "DELETE", vmssPath+apiV, nil)

	var zero armcompute.VirtualMachineScaleSet
	resp := f.call("PUT", setsPath+"/empty"+apiV, armcompute.VirtualMachineScaleSet{Location: ptr("westeurope")})
	if err := json.Unmarshal(resp.body, &zero); err != nil || resp.status != 201 ||
		!strings.Contains(string(resp.body), `"capacity":0`) || *zero.Properties.VirtualMachineProfile.OSProfile.ComputerNamePrefix != "empty" {
		t.Fatalf("empty set: %d %s", resp.status, resp.body)
	}
}

func mustJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

func TestListPaging(t *testing.T) {
	f := startFake(t, func(c *config) { c.pageSize = 5 })
	for _, name := range []string{"e", "c", "a", "d", "b", "f"} {
		f.createSet(name, 0)
	}
	var first armcompute.VirtualMachineScaleSetListResult
	f.must(200, "GET", setsPath+apiV, nil, &first)
	next := deref(first.NextLink)
	if len(first.Value) != 5 || *first.Value[0].Name != "a" || *first.Value[4].Name != "e" ||
		!strings.HasPrefix(next, f.url+setsPath+"?") || !strings.Contains(next, "api-version=2024-07-01") ||
		!strings.Contains(next, "$skiptoken=") {
		t.Fatalf("first page: %s", mustJSON(&first))
	}
	var second armcompute.VirtualMachineScaleSetListResult
	f.must(200, "GET", next, nil, &second)
	if len(second.Value) != 1 || *second.Value[0].Name != "f" || second.NextLink != nil {
		t.Fatalf("second page: %s", mustJSON(&second))
	}

	f.createSet("workers", 12)
	vms := f.vms()
	if got := instanceIDs(vms); got != "0,1,2,3,4,5,6,7,8,9,10,11" {
		t.Fatalf("VM ids over pages: %s", got)
	}
	if *vms[10].Properties.OSProfile.ComputerName != "worker00000a" || *vms[10].Name != "workers_10" ||
		*vms[10].ID != vmssPath+"/virtualMachines/10" || *vms[10].Type != scaleSetVMType {
		t.Fatalf("VM 10: %s", mustJSON(vms[10]))
	}
}

func TestPatchCapacityAndLRO(t *testing.T) {
	f := startFake(t, func(c *config) { c.opDelay, c.boot = time.Second, 3*time.Second })
	f.createSet("workers", 2)
	hdr := f.patch(armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: ptr[int64](4)}})
	async := hdr.Get("Azure-AsyncOperation")
	wantPrefix := f.url + "/subscriptions/" + testSub + "/providers/Microsoft.Compute/locations/westeurope/operations/"
	if !strings.HasPrefix(async, wantPrefix) || !strings.HasSuffix(async, "?api-version=2024-07-01") ||
		hdr.Get("Retry-After") != "0" || *f.getSet().Properties.ProvisioningState != "Updating" {
		t.Fatalf("PATCH headers: %v", hdr)
	}
	var st operationStatus
	hdr = f.must(200, "GET", async, nil, &st)
	if st.Status != "InProgress" || hdr.Get("Retry-After") != "0" || st.EndTime != "" {
		t.Fatalf("operation: %+v", st)
	}
	eventually(t, "operation Succeeded", func() bool {
		f.must(200, "GET", async, nil, &st)
		return st.Status == "Succeeded"
	})
	set := f.getSet()
	if st.EndTime == "" || *set.Properties.ProvisioningState != "Succeeded" || *set.SKU.Capacity != 4 || *set.Etag != `"2"` {
		t.Fatalf("after the operation: %+v %s", st, mustJSON(set))
	}
	vms := f.vms()
	if instanceIDs(vms) != "0,1,2,3" || *vms[3].Properties.OSProfile.ComputerName != "worker000003" ||
		*vms[3].Properties.ProvisioningState != "Creating" {
		t.Fatalf("grown: %s", mustJSON(vms))
	}
	f.armErr(404, "NotFound", "GET", strings.Replace(async, "/operations/", "/operations/x", 1), nil)
}

func TestInstanceIDsNeverRepeatAndScaleIn(t *testing.T) {
	f := startFake(t, nil)
	f.createSet("workers", 3)
	f.must(202, "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"2"}}, nil)
	eventually(t, "VM 2 gone", func() bool { return instanceIDs(f.vms()) == "0,1" })
	f.patch(armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: ptr[int64](4)}})
	if got := instanceIDs(f.vms()); got != "0,1,3,4" {
		t.Fatalf("after growing again: %s", got)
	}
	f.patch(armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: ptr[int64](2)}})
	for _, v := range f.vms() {
		deleting := *v.InstanceID == "3" || *v.InstanceID == "4"
		if got := *v.Properties.ProvisioningState; (got == "Deleting") != deleting {
			t.Fatalf("scale-in: VM %s is %s", *v.InstanceID, got)
		}
	}
	eventually(t, "scaled in", func() bool { return instanceIDs(f.vms()) == "0,1" })
}

func TestIfMatchAndTags(t *testing.T) {
	f := startFake(t, nil)
	f.createSet("workers", 1)
	etag := *f.getSet().Etag
	body := armcompute.VirtualMachineScaleSetUpdate{Tags: map[string]*string{"b": ptr("2")}, SKU: &armcompute.SKU{Capacity: ptr[int64](3)}}
	f.armErr(412, "PreconditionFailed", "PATCH", vmssPath+apiV, body, "If-Match", `"99"`)
	set := f.getSet()
	if *set.Etag != etag || *set.SKU.Capacity != 1 || len(set.Tags) != 1 || len(f.vms()) != 1 {
		t.Fatalf("a failed If-Match changed the set: %s", mustJSON(set))
	}
	f.patch(body, "If-Match", etag)
	set = f.getSet()
	if *set.Etag == etag || len(set.Tags) != 1 || *set.Tags["b"] != "2" || *set.SKU.Capacity != 3 {
		t.Fatalf("tags not replaced: %s", mustJSON(set))
	}
	f.patch(armcompute.VirtualMachineScaleSetUpdate{Tags: map[string]*string{}}, "If-Match", "*")
	if set = f.getSet(); len(set.Tags) != 0 || *set.SKU.Capacity != 3 {
		t.Fatalf("empty tags: %s", mustJSON(set))
	}
	f.armErr(404, "ResourceNotFound", "PATCH", setsPath+"/nope"+apiV, body)
	f.armErr(400, "InvalidParameter", "PATCH", vmssPath+apiV,
		armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: ptr[int64](-1)}})
	f.armErr(400, "InvalidRequestContent", "PATCH", vmssPath+apiV, "not an object")
}

func TestImageChangeOnlyNewVMs(t *testing.T) {
	f := startFake(t, nil)
	f.createSet("workers", 1)
	f.patch(armcompute.VirtualMachineScaleSetUpdate{
		SKU: &armcompute.SKU{Capacity: ptr[int64](2)},
		Properties: &armcompute.VirtualMachineScaleSetUpdateProperties{
			VirtualMachineProfile: &armcompute.VirtualMachineScaleSetUpdateVMProfile{
				StorageProfile: &armcompute.VirtualMachineScaleSetUpdateStorageProfile{ImageReference: &armcompute.ImageReference{ID: ptr(image2)}},
			},
		},
	})
	vms := f.vms()
	old, young := vms[0].Properties, vms[1].Properties
	if *old.StorageProfile.ImageReference.ID != image1 || *old.LatestModelApplied ||
		*young.StorageProfile.ImageReference.ID != image2 || !*young.LatestModelApplied {
		t.Fatalf("images: %s", mustJSON(vms))
	}
	if got := *f.getSet().Properties.VirtualMachineProfile.StorageProfile.ImageReference.ID; got != image2 {
		t.Fatalf("model image: %s", got)
	}
}

func TestDeleteInstances(t *testing.T) {
	f := startFake(t, func(c *config) { c.opDelay, c.stop = time.Second, time.Second })
	f.createSet("workers", 3)
	body := map[string]any{"instanceIds": []string{"0", "1"}}
	hdr := f.must(202, "POST", vmssPath+"/delete"+apiV, body, nil)
	location, async := hdr.Get("Location"), hdr.Get("Azure-AsyncOperation")
	if !strings.Contains(location, "/locations/westeurope/operationResults/") || !strings.HasPrefix(location, f.url) ||
		!strings.Contains(async, "/operations/") || hdr.Get("Retry-After") != "0" {
		t.Fatalf("delete headers: %v", hdr)
	}
	if resp := f.call("GET", location, nil); resp.status != 202 || resp.header.Get("Location") != location || len(resp.body) != 0 {
		t.Fatalf("operation result in progress: %d %v", resp.status, resp.header)
	}
	set := f.getSet()
	if *set.SKU.Capacity != 1 || *f.vms()[0].Properties.ProvisioningState != "Deleting" {
		t.Fatalf("after delete: %s", mustJSON(set))
	}
	// Again, with one already Deleting: a no-op for it.
	f.must(202, "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"1"}}, nil)
	if *f.getSet().SKU.Capacity != 1 {
		t.Fatal("deleting a Deleting VM again dropped the capacity")
	}
	f.armErr(404, "NotFound", "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"2", "7"}})
	f.armErr(400, "InvalidParameter", "POST", vmssPath+"/delete"+apiV, map[string]any{})
	var vm2 armcompute.VirtualMachineScaleSetVM
	f.must(200, "GET", vmssPath+"/virtualMachines/2"+apiV, nil, &vm2)
	if *vm2.Properties.ProvisioningState == "Deleting" || *f.getSet().SKU.Capacity != 1 {
		t.Fatal("a delete with a non-member changed something")
	}
	eventually(t, "operation result 200", func() bool { return f.call("GET", location, nil).status == 200 })
	eventually(t, "VMs gone", func() bool { return instanceIDs(f.vms()) == "2" })
	f.armErr(404, "ResourceNotFound", "GET", vmssPath+"/virtualMachines/0"+apiV, nil)
	f.armErr(404, "NotFound", "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"0"}})
}

func (f *fake) instanceView(id string) (state, power string) {
	f.t.Helper()
	var view armcompute.VirtualMachineScaleSetVMInstanceView
	f.must(200, "GET", vmssPath+"/virtualMachines/"+id+"/instanceView"+apiV, nil, &view)
	if len(view.Statuses) != 2 || *view.ComputerName != computerName("worker", mustAtoi(id)) {
		f.t.Fatalf("instance view: %s", mustJSON(&view))
	}
	if state = *view.Statuses[0].Code; strings.HasSuffix(state, "failed") != (*view.Statuses[0].Level == armcompute.StatusLevelTypesError) {
		f.t.Fatalf("level of %s: %s", state, *view.Statuses[0].Level)
	}
	return state, *view.Statuses[1].Code
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func TestInstanceViewAndControl(t *testing.T) {
	f := startFake(t, func(c *config) { c.boot, c.stop = time.Second, time.Second })
	f.createSet("workers", 3)
	if state, power := f.instanceView("1"); state != "ProvisioningState/creating" || power != "PowerState/starting" {
		t.Fatalf("new VM: %s %s", state, power)
	}
	eventually(t, "VM booted", func() bool {
		state, power := f.instanceView("1")
		return state == "ProvisioningState/succeeded" && power == "PowerState/running"
	})
	f.must(200, "POST", "/fake/vms/workers/1/state?provisioning=Failed&power=stopped", nil, nil)
	if state, power := f.instanceView("1"); state != "ProvisioningState/failed" || power != "PowerState/stopped" {
		t.Fatalf("after control: %s %s", state, power)
	}
	f.must(200, "POST", "/fake/vms/workers/0/state?power=deallocated", nil, nil)
	if state, power := f.instanceView("0"); state != "ProvisioningState/succeeded" || power != "PowerState/deallocated" {
		t.Fatalf("deallocated: %s %s", state, power)
	}
	f.must(202, "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"1"}}, nil)
	if state, power := f.instanceView("1"); state != "ProvisioningState/deleting" || power != "PowerState/stopping" {
		t.Fatalf("deleting: %s %s", state, power)
	}
	f.must(200, "POST", "/fake/vms/workers/2/delete", nil, nil)
	f.armErr(404, "ResourceNotFound", "GET", vmssPath+"/virtualMachines/2/instanceView"+apiV, nil)
	if *f.getSet().SKU.Capacity != 2 {
		t.Fatal("a vanished VM changed the capacity")
	}
	f.armErr(404, "NotFound", "POST", "/fake/vms/workers/2/delete", nil)
	var vm armcompute.VirtualMachineScaleSetVM
	f.must(200, "GET", vmssPath+"/virtualMachines/0"+apiV+"&$expand=instanceView", nil, &vm)
	if vm.Properties.InstanceView == nil || *vm.Properties.VMID == "" {
		t.Fatalf("VM with $expand: %s", mustJSON(&vm))
	}
}

func TestFailedOperation(t *testing.T) {
	f := startFake(t, nil)
	f.createSet("workers", 1)
	hdr := f.must(202, "POST", vmssPath+"/delete"+apiV, map[string]any{"instanceIds": []string{"0"}}, nil)
	async := hdr.Get("Azure-AsyncOperation")
	opID := async[strings.LastIndex(async, "/")+1 : strings.Index(async, "?")]
	f.must(200, "POST", "/fake/operations/"+opID+"/fail?code=OperationPreempted", nil, nil)
	var st operationStatus
	eventually(t, "operation Failed", func() bool {
		f.must(200, "GET", async, nil, &st)
		return st.Status == "Failed"
	})
	if st.Error == nil || st.Error.Code != "OperationPreempted" {
		t.Fatalf("failed operation: %+v", st)
	}
	f.armErr(500, "OperationPreempted", "GET", hdr.Get("Location"), nil)
}

func TestAADTokens(t *testing.T) {
	f := startFake(t, func(c *config) { c.clientSecret, c.federatedToken = "s3cret", "k8s-sa-jwt" })
	form := func(kv ...string) url.Values {
		v := url.Values{"grant_type": {"client_credentials"}, "client_id": {"app-1"}, "scope": {managementScope}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	var tok map[string]any
	f.must(200, "POST", tokenPath, form("client_secret", "s3cret"), &tok)
	if tok["access_token"] != "fake-aad-1" || tok["token_type"] != "Bearer" || tok["expires_in"] != float64(3600) ||
		tok["ext_expires_in"] != float64(3600) {
		t.Fatalf("secret token: %v", tok)
	}
	f.must(200, "POST", tokenPath, form("client_assertion_type", jwtBearerAssertion, "client_assertion", "k8s-sa-jwt",
		"scope", managementScope+" openid offline_access profile"), &tok)
	if tok["access_token"] != "fake-aad-2" {
		t.Fatalf("federated token: %v", tok)
	}
	bad := []struct {
		form   url.Values
		status int
		code   string
	}{
		{form("client_secret", "wrong"), 401, "invalid_client"},
		{form(), 401, "invalid_client"},
		{form("client_assertion_type", jwtBearerAssertion, "client_assertion", "other"), 401, "invalid_client"},
		{form("client_assertion_type", "jwt", "client_assertion", "k8s-sa-jwt"), 400, "invalid_request"},
		{form("client_secret", "s3cret", "scope", "https://graph.microsoft.com/.default"), 400, "invalid_scope"},
		{form("client_secret", "s3cret", "client_id", ""), 400, "invalid_request"},
		{form("client_secret", "s3cret", "grant_type", "password"), 400, "unsupported_grant_type"},
	}
	for _, b := range bad {
		var e map[string]string
		f.must(b.status, "POST", tokenPath, b.form, &e)
		if e["error"] != b.code || e["error_description"] == "" {
			t.Fatalf("%v: %v", b.form, e)
		}
	}
}

func TestIMDSToken(t *testing.T) {
	f := startFake(t, nil)
	var e map[string]string
	f.must(400, "GET", imdsPath, nil, &e)
	if e["error"] != "bad_request" || e["error_description"] != "Required metadata header not specified" {
		t.Fatalf("no Metadata header: %v", e)
	}
	f.must(400, "GET", "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://vault.azure.net",
		nil, nil, "Metadata", "true")
	var tok map[string]string
	before := time.Now().Unix()
	f.must(200, "GET", imdsPath+"&client_id=mi-1", nil, &tok, "Metadata", "true")
	expiresOn, _ := strconv.ParseInt(tok["expires_on"], 10, 64)
	if tok["access_token"] != "fake-mi-1" || tok["expires_in"] != "3600" || tok["client_id"] != "mi-1" ||
		tok["resource"] != managementResource || tok["token_type"] != "Bearer" || expiresOn < before+3600 {
		t.Fatalf("IMDS token: %v", tok)
	}
	f.must(200, "GET", "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com",
		nil, &tok, "Metadata", "true")
	if tok["access_token"] != "fake-mi-2" || tok["client_id"] != defaultMIClientID {
		t.Fatalf("second IMDS token: %v", tok)
	}
}

func TestRequireToken(t *testing.T) {
	f := startFake(t, func(c *config) { c.requireToken, c.tokenTTL = true, 2*time.Second })
	f.armErr(401, "AuthenticationFailed", "GET", setsPath+apiV, nil)
	f.armErr(401, "AuthenticationFailed", "GET", setsPath+apiV, nil, "Authorization", "Bearer forged")
	var tok map[string]string
	f.must(200, "GET", imdsPath, nil, &tok, "Metadata", "true")
	bearer := "Bearer " + tok["access_token"]
	f.must(200, "GET", setsPath+apiV, nil, nil, "Authorization", bearer)
	// The 401 comes before a failure rule, which stays for the next call.
	f.must(200, "POST", "/fake/fail?status=500", nil, nil)
	f.armErr(401, "AuthenticationFailed", "GET", setsPath+apiV, nil)
	f.armErr(500, "InternalServerError", "GET", setsPath+apiV, nil, "Authorization", bearer)
	eventually(t, "token expired", func() bool {
		return f.call("GET", setsPath+apiV, nil, "Authorization", bearer).status == 401
	})
	var seen struct {
		Issued        []issuedToken `json:"issued"`
		Authorization []string      `json:"authorization"`
	}
	f.must(200, "GET", "/fake/tokens", nil, &seen)
	if len(seen.Issued) != 1 || seen.Issued[0].Kind != "mi" || seen.Issued[0].ClientID != defaultMIClientID ||
		seen.Authorization[0] != "" || seen.Authorization[1] != "Bearer forged" || seen.Authorization[2] != bearer {
		t.Fatalf("/fake/tokens: %+v", seen)
	}
}

func TestFailureInjection(t *testing.T) {
	f := startFake(t, nil)
	f.must(200, "POST", "/fake/fail?status=503&path=/virtualMachineScaleSets/workers", nil, nil)
	f.armErr(503, "ServiceUnavailable", "PUT", vmssPath+apiV, armcompute.VirtualMachineScaleSet{Location: ptr("westeurope")})
	f.armErr(404, "ResourceNotFound", "GET", vmssPath+apiV, nil)

	f.must(200, "POST", "/fake/fail-after?status=429", nil, nil)
	// An empty path matches ARM calls only: the token fetch does not use it up.
	f.must(200, "GET", imdsPath, nil, nil, "Metadata", "true")
	resp := f.call("PUT", vmssPath+apiV, armcompute.VirtualMachineScaleSet{Location: ptr("westeurope")})
	if resp.status != 429 || resp.header.Get("Retry-After") != "0" || resp.header.Get("x-ms-error-code") != "TooManyRequests" {
		t.Fatalf("fail-after: %d %v %s", resp.status, resp.header, resp.body)
	}
	f.getSet() // carried out

	f.must(200, "POST", "/fake/hang?path=/virtualMachineScaleSets/hung", nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "PUT", f.url+setsPath+"/hung"+apiV, strings.NewReader(`{"location":"westeurope"}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("hung request answered")
	}
	f.must(200, "GET", setsPath+"/hung"+apiV, nil, nil)

	f.must(200, "POST", "/fake/fail?count=2&path=oauth2", nil, nil)
	f.must(200, "POST", "/fake/clear-failures", nil, nil)
	f.must(200, "GET", imdsPath, nil, nil, "Metadata", "true")

	var records []requestRecord
	f.must(200, "GET", "/fake/requests", nil, &records)
	if len(records) != 8 || records[0].Injected != "fail" || records[0].Status != 503 ||
		records[3].Injected != "fail-after" || records[3].Status != 429 || records[5].Injected != "hang" ||
		records[5].Query != "api-version=2024-07-01" {
		t.Fatalf("requests: %+v", records)
	}
}

func TestCanonicalPath(t *testing.T) {
	in := "/SUBSCRIPTIONS/s/resourcegroups/Delete/PROVIDERS/microsoft.compute/VirtualMachineScaleSets/providers/virtualmachines/3/INSTANCEVIEW"
	want := "/subscriptions/s/resourceGroups/Delete/providers/Microsoft.Compute/virtualMachineScaleSets/providers/virtualMachines/3/instanceView"
	if got := canonicalPath(in); got != want {
		t.Fatalf("canonicalPath:\n got %s\nwant %s", got, want)
	}
	if got := computerName("worker", 36*36*36*36*36*36-1); got != "workerzzzzzz" {
		t.Fatalf("computerName: %s", got)
	}
}
