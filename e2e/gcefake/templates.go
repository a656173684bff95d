package main

import (
	"net/http"
	"strconv"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// getProject answers any project name with the configured number; the
// number itself names the project first seen by name.
func (s *server) getProject(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.project(r)
	number := strconv.FormatUint(s.cfg.projectNumber, 10)
	if p == number {
		return nil, errNotFound("projects/" + p)
	}
	return &compute.Project{
		Kind: "compute#project", Name: p, Id: s.cfg.projectNumber,
		SelfLink:              link("projects/" + p),
		DefaultServiceAccount: number + "-compute@developer.gserviceaccount.com",
	}, nil
}

func (s *server) insertTemplate(r *http.Request) (any, error) {
	var t compute.InstanceTemplate
	if err := decodeBody(r, &t); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.project(r)
	if op, err := s.replay(p, r); op != nil || err != nil {
		return op, err
	}
	if err := checkName("resource.name", t.Name); err != nil {
		return nil, err
	}
	path := templatePath(p, t.Name)
	if s.templates[p+"/"+t.Name] != nil {
		return nil, errAlreadyExists(path)
	}
	now := time.Now()
	t.Kind, t.Id, t.SelfLink, t.CreationTimestamp = "compute#instanceTemplate", s.newID(), link(path), timestamp(now)
	s.templates[p+"/"+t.Name] = &t
	o := s.newOperation(r, p, "", "insert", t.SelfLink, t.Id)
	return s.answer(o), nil
}

func (s *server) getTemplate(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, name := s.project(r), r.PathValue("template")
	if t := s.templates[p+"/"+name]; t != nil {
		return t, nil
	}
	return nil, errNotFound(templatePath(p, name))
}

// templateByRef finds the template a reference names and returns it with its
// full URL; 404 when there is none.
func (s *server) templateByRef(ref, defaultProject string) (*compute.InstanceTemplate, error) {
	project, name, err := parseTemplateRef(ref, defaultProject)
	if err != nil {
		return nil, err
	}
	if project == strconv.FormatUint(s.cfg.projectNumber, 10) && s.firstProject != "" {
		project = s.firstProject
	}
	t := s.templates[project+"/"+name]
	if t == nil {
		return nil, errNotFound(templatePath(project, name))
	}
	return t, nil
}
