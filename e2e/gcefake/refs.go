package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// apiBase prefixes every selfLink and URL in answers, as GCE writes them,
// whatever address the fake itself listens on.
const apiBase = "https://www.googleapis.com/compute/v1/"

func link(path string) string { return apiBase + path }

func zonePath(project, zone string) string { return "projects/" + project + "/zones/" + zone }

func instancePath(project, zone, name string) string {
	return zonePath(project, zone) + "/instances/" + name
}

func groupPath(project, zone, name string) string {
	return zonePath(project, zone) + "/instanceGroupManagers/" + name
}

func templatePath(project, name string) string {
	return "projects/" + project + "/global/instanceTemplates/" + name
}

func diskPath(project, zone, name string) string { return zonePath(project, zone) + "/disks/" + name }

// refCollections are the path segments followed by a resource name in the
// references clients send (full URLs or partial paths).
var refCollections = map[string]bool{
	"projects": true, "zones": true, "regions": true, "instances": true,
	"instanceTemplates": true, "instanceGroupManagers": true, "disks": true,
}

// parseRef splits a resource reference (https://.../compute/v1/projects/P/zones/Z/instances/I,
// projects/P/zones/Z/instances/I, zones/Z/instances/I, global/instanceTemplates/T, ...)
// into collection -> name, and says which collection came last.
func parseRef(ref string) (names map[string]string, last string) {
	if _, rest, ok := strings.Cut(ref, "://"); ok {
		_, ref, _ = strings.Cut(rest, "/") // drop the host
	}
	names = map[string]string{}
	segs := strings.Split(strings.Trim(ref, "/"), "/")
	for i := 0; i+1 < len(segs); i++ {
		if refCollections[segs[i]] && segs[i+1] != "" {
			names[segs[i]], last = segs[i+1], segs[i]
			i++
		}
	}
	return names, last
}

// parseTemplateRef names the global instance template a reference points at;
// a reference without a project means defaultProject.
func parseTemplateRef(ref, defaultProject string) (project, name string, err error) {
	names, last := parseRef(ref)
	if last != "instanceTemplates" || names["regions"] != "" || !strings.Contains(ref, "global/") {
		return "", "", errInvalid("Invalid value for field 'instanceTemplate': '%s'. "+
			"The URL is malformed.", ref)
	}
	project = names["projects"]
	if project == "" {
		project = defaultProject
	}
	return project, names["instanceTemplates"], nil
}

// parseInstanceRef reads zones/Z/instances/I with an optional projects/P
// before it (or a full URL); project is empty when the reference has none.
func parseInstanceRef(ref string) (project, zone, name string, ok bool) {
	names, last := parseRef(ref)
	if last != "instances" || names["zones"] == "" {
		return "", "", "", false
	}
	return names["projects"], names["zones"], names["instances"], true
}

var namePattern = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// checkName applies GCE's RFC 1035 rule for resource names.
func checkName(field, name string) error {
	if name == "" {
		return errRequired(field)
	}
	if !namePattern.MatchString(name) {
		return errInvalid("Invalid value for field '%s': '%s'. Must be a match of regex "+
			"'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", field, name)
	}
	return nil
}

var requestIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// checkRequestID applies GCE's rule: a requestId must be a UUID, not the zero one.
func checkRequestID(id string) error {
	if !requestIDPattern.MatchString(id) || strings.Trim(id, "0-") == "" {
		return errInvalid("Invalid value for field 'requestId': '%s'. "+
			"The request id must be a valid UUID with the exception that zero UUID is not supported.", id)
	}
	return nil
}

// timestamp formats like GCE's creationTimestamp: RFC 3339, milliseconds, offset.
func timestamp(t time.Time) string { return t.Format("2006-01-02T15:04:05.000-07:00") }

func (s *server) newID() uint64 {
	s.seq++
	return s.seq
}

func randomString(alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// operationName looks like GCE's: operation-<unix ms>-<hex>-<hex>-<hex>.
func operationName(now time.Time) string {
	const hex = "0123456789abcdef"
	return fmt.Sprintf("operation-%d-%s-%s-%s", now.UnixMilli(),
		randomString(hex, 13), randomString(hex, 8), randomString(hex, 8))
}

// project resolves the {project} path value and remembers the first name seen:
// GCE accepts a project's number wherever its name goes.
func (s *server) project(r *http.Request) string {
	p := r.PathValue("project")
	if p == strconv.FormatUint(s.cfg.projectNumber, 10) {
		if s.firstProject != "" {
			return s.firstProject
		}
		return p
	}
	if s.firstProject == "" {
		s.firstProject = p
	}
	return p
}
