package main

import (
	"cmp"
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
)

// pageEntry is one item of a list answer, with what it is sorted by.
type pageEntry[T any] struct {
	name, zone string
	item       T
}

func (e pageEntry[T]) key() string { return e.name + "\x00" + e.zone }

// paginate applies maxResults (default and maximum 500, as GCE) and pageToken
// to entries sorted by name then zone. The token is the last key served, so
// paging stays consistent while items come and go.
func paginate[T any](entries []pageEntry[T], q url.Values) (page []pageEntry[T], next string, err error) {
	limit, err := maxResults(q.Get("maxResults"))
	if err != nil {
		return nil, "", err
	}
	slices.SortFunc(entries, func(a, b pageEntry[T]) int { return cmp.Compare(a.key(), b.key()) })
	if tok := q.Get("pageToken"); tok != "" {
		after, decodeErr := base64.RawURLEncoding.DecodeString(tok)
		if decodeErr != nil {
			return nil, "", errInvalid("Invalid value for field 'pageToken': '%s'.", tok)
		}
		i, _ := slices.BinarySearchFunc(entries, string(after), func(e pageEntry[T], k string) int {
			return cmp.Compare(e.key(), k)
		})
		for i < len(entries) && entries[i].key() <= string(after) {
			i++
		}
		entries = entries[i:]
	}
	if len(entries) > limit {
		entries = entries[:limit]
		next = base64.RawURLEncoding.EncodeToString([]byte(entries[limit-1].key()))
	}
	return entries, next, nil
}

func maxResults(v string) (int, error) {
	if v == "" {
		return 500, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 500 {
		return 0, errInvalid("Invalid value for field 'maxResults': '%s'. Must be less than or equal to 500", v)
	}
	if n == 0 {
		return 500, nil
	}
	return n, nil
}
