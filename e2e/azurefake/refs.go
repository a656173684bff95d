package main

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	computeNamespace = "Microsoft.Compute"
	scaleSetType     = computeNamespace + "/virtualMachineScaleSets"
	scaleSetVMType   = scaleSetType + "/virtualMachines"
)

// canonicalWords are the path keywords of the ARM calls the fake knows, in the
// casing its answers use; ARM matches them case-insensitively.
var canonicalWords = []string{
	"subscriptions", "resourceGroups", "providers", computeNamespace, "virtualMachineScaleSets",
	"virtualMachines", "instanceView", "delete", "locations", "operations", "operationResults",
}

func isARM(path string) bool { return strings.HasPrefix(strings.ToLower(path), "/subscriptions/") }

// canonicalPath spells the keywords of an ARM path (/subscriptions/S/resourceGroups/RG/
// providers/Microsoft.Compute/virtualMachineScaleSets/N/...) as canonicalWords
// do, leaving the names between them as they are. Keywords and names
// alternate, except that "providers" and the namespace are both keywords.
func canonicalPath(path string) string {
	segs := strings.Split(path, "/")
	keyword := true
	for i := 1; i < len(segs); i++ {
		if !keyword {
			keyword = true
			continue
		}
		segs[i] = canonicalWord(segs[i])
		keyword = segs[i] == "providers" || segs[i] == computeNamespace
	}
	return strings.Join(segs, "/")
}

func canonicalWord(seg string) string {
	for _, w := range canonicalWords {
		if strings.EqualFold(seg, w) {
			return w
		}
	}
	return seg
}

func scaleSetID(sub, rg, name string) string {
	return "/subscriptions/" + sub + "/resourceGroups/" + rg + "/providers/" + scaleSetType + "/" + name
}

// operationPath is the path of an operation's status (kind "operations") or
// result (kind "operationResults").
func operationPath(sub, location, kind, id string) string {
	return "/subscriptions/" + sub + "/providers/" + computeNamespace + "/locations/" + location + "/" + kind + "/" + id
}

// fakeURL is path (with its api-version) as an absolute URL on the fake's own
// host, the one the client called.
func fakeURL(r *http.Request, path string) string {
	return "http://" + r.Host + path + "?api-version=" + url.QueryEscape(r.URL.Query().Get("api-version"))
}

// computerName is the prefix and the instance id as 6 lower-case base-36
// digits: "worker" and 10 make "worker00000a".
func computerName(prefix string, instanceID int) string {
	digits := strconv.FormatInt(int64(instanceID), 36)
	if len(digits) < 6 {
		digits = strings.Repeat("0", 6-len(digits)) + digits
	}
	return prefix + digits
}

// normalLocation is a location as ARM answers it: "West Europe" -> "westeurope".
func normalLocation(location string) string {
	return strings.ToLower(strings.ReplaceAll(location, " ", ""))
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// timestamp is ARM's time format.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func ptr[T any](v T) *T { return &v }
