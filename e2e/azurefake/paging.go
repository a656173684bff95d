package main

import (
	"cmp"
	"encoding/base64"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// pageEntry is one item of a list answer, with the key it is sorted by.
type pageEntry[T any] struct {
	key  string
	item T
}

// paginate sorts entries by key and answers the page after the request's
// $skiptoken (-page-size items), and the nextLink when more follow. The token
// is the last key served, so paging stays consistent while items come and go.
func paginate[T any](r *http.Request, entries []pageEntry[T], size int) (page []T, next *string, err error) {
	slices.SortFunc(entries, func(a, b pageEntry[T]) int { return cmp.Compare(a.key, b.key) })
	if tok := r.URL.Query().Get("$skiptoken"); tok != "" {
		after, decodeErr := base64.RawURLEncoding.DecodeString(tok)
		if decodeErr != nil {
			return nil, nil, errInvalidParameter("$skiptoken", "The value '%s' of $skiptoken is not valid.", tok)
		}
		entries = slices.DeleteFunc(entries, func(e pageEntry[T]) bool { return e.key <= string(after) })
	}
	if len(entries) > size {
		entries = entries[:size]
		next = ptr(nextLink(r, base64.RawURLEncoding.EncodeToString([]byte(entries[size-1].key))))
	}
	page = make([]T, 0, len(entries))
	for _, e := range entries {
		page = append(page, e.item)
	}
	return page, next, nil
}

// nextLink is the request's URL on the fake's own host with $skiptoken set to
// token; the other query parameters (api-version, $expand) are kept. Keys are
// written as ARM writes them, "$" unescaped.
func nextLink(r *http.Request, token string) string {
	q := r.URL.Query()
	q.Set("$skiptoken", token)
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(q)) {
		key := strings.ReplaceAll(url.QueryEscape(k), "%24", "$")
		for _, v := range q[k] {
			parts = append(parts, key+"="+url.QueryEscape(v))
		}
	}
	return "http://" + r.Host + r.URL.Path + "?" + strings.Join(parts, "&")
}
