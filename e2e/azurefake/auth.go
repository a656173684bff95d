package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	managementScope    = "https://management.azure.com/.default"
	managementResource = "https://management.azure.com/"
	jwtBearerAssertion = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
	// defaultMIClientID is the client_id IMDS reports when the request names none.
	defaultMIClientID = "00000000-0000-0000-0000-00000000f00d"
)

// oidcScopes may come with the resource scope: MSAL adds them to every request.
var oidcScopes = map[string]bool{"openid": true, "offline_access": true, "profile": true}

// authorize records the ARM call's Authorization header and, with
// -require-token, rejects it (401) unless it carries a live token this fake
// issued.
func (s *server) authorize(r *http.Request) *armError {
	header := r.Header.Get("Authorization")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authHeaders = append(s.authHeaders, header)
	if !s.cfg.requireToken {
		return nil
	}
	if header == "" {
		return errAuthenticationFailed("Authentication failed. The 'Authorization' header is missing.")
	}
	token, ok := strings.CutPrefix(header, "Bearer ")
	if t := s.issued(token); !ok || t == nil || time.Now().After(t.ExpiresAt) {
		return errAuthenticationFailed("Authentication failed. The access token is not one the fake issued, or it expired.")
	}
	return nil
}

func (s *server) issued(token string) *issuedToken {
	for _, t := range s.tokens {
		if t.Token == token {
			return t
		}
	}
	return nil
}

// issue records a new token of this kind (aad-secret, aad-federated, mi),
// named fake-aad-<n> or fake-mi-<n>, n counting all tokens.
func (s *server) issue(kind, clientID string) *issuedToken {
	s.mu.Lock()
	defer s.mu.Unlock()
	prefix, _, _ := strings.Cut(kind, "-")
	now := time.Now()
	t := &issuedToken{Token: fmt.Sprintf("fake-%s-%d", prefix, len(s.tokens)+1), Kind: kind,
		ClientID: clientID, IssuedAt: now, ExpiresAt: now.Add(s.cfg.tokenTTL)}
	s.tokens = append(s.tokens, t)
	return t
}

// oauthError is an error of Azure AD or IMDS: {"error":..., "error_description":...}.
type oauthError struct {
	status      int
	code        string
	description string
}

func writeOAuthError(w http.ResponseWriter, e *oauthError) {
	writeJSON(w, e.status, map[string]string{"error": e.code, "error_description": e.description})
}

// aadToken is POST /{tenant}/oauth2/v2.0/token, Azure AD's client-credentials
// grant with a client secret or a federated (workload identity) assertion.
func (s *server) aadToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeOAuthError(w, &oauthError{http.StatusBadRequest, "invalid_request", err.Error()})
		return
	}
	kind, e := s.checkClientCredentials(r.PostForm)
	if e != nil {
		writeOAuthError(w, e)
		return
	}
	t := s.issue(kind, r.PostForm.Get("client_id"))
	ttl := int(s.cfg.tokenTTL.Seconds())
	writeJSON(w, http.StatusOK, map[string]any{
		"token_type": "Bearer", "expires_in": ttl, "ext_expires_in": ttl, "access_token": t.Token,
	})
}

// checkClientCredentials checks the form as Azure AD would and says which
// kind of token it earns.
func (s *server) checkClientCredentials(form url.Values) (string, *oauthError) {
	if grant := form.Get("grant_type"); grant != "client_credentials" {
		return "", &oauthError{http.StatusBadRequest, "unsupported_grant_type",
			fmt.Sprintf("AADSTS70003: The app requested an unsupported grant type '%s'.", grant)}
	}
	if form.Get("client_id") == "" {
		return "", &oauthError{http.StatusBadRequest, "invalid_request",
			"AADSTS900144: The request body must contain the following parameter: 'client_id'."}
	}
	if !isManagementScope(form.Get("scope")) {
		return "", &oauthError{http.StatusBadRequest, "invalid_scope",
			fmt.Sprintf("AADSTS70011: The provided value for the input parameter 'scope' is not valid. "+
				"The scope %s is not valid; want %s.", form.Get("scope"), managementScope)}
	}
	if form.Has("client_assertion") || form.Has("client_assertion_type") {
		return s.checkAssertion(form)
	}
	return s.checkSecret(form)
}

// isManagementScope: the scope is ARM's .default, perhaps with the OpenID
// scopes MSAL adds.
func isManagementScope(scope string) bool {
	found := false
	for _, sc := range strings.Fields(scope) {
		switch {
		case sc == managementScope && !found:
			found = true
		case !oidcScopes[sc]:
			return false
		}
	}
	return found
}

func (s *server) checkSecret(form url.Values) (string, *oauthError) {
	secret := form.Get("client_secret")
	if secret == "" {
		return "", &oauthError{http.StatusUnauthorized, "invalid_client",
			"AADSTS7000218: The request body must contain the following parameter: 'client_assertion' or 'client_secret'."}
	}
	if s.cfg.clientSecret != "" && secret != s.cfg.clientSecret {
		return "", &oauthError{http.StatusUnauthorized, "invalid_client",
			"AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is " +
				"the client secret value, not the client secret ID, for a secret added to app '" + form.Get("client_id") + "'."}
	}
	return "aad-secret", nil
}

func (s *server) checkAssertion(form url.Values) (string, *oauthError) {
	if t := form.Get("client_assertion_type"); t != jwtBearerAssertion {
		return "", &oauthError{http.StatusBadRequest, "invalid_request",
			fmt.Sprintf("AADSTS50027: client_assertion_type '%s' is not supported; want %s.", t, jwtBearerAssertion)}
	}
	assertion := form.Get("client_assertion")
	if assertion == "" || (s.cfg.federatedToken != "" && assertion != s.cfg.federatedToken) {
		return "", &oauthError{http.StatusUnauthorized, "invalid_client",
			"AADSTS700213: No matching federated identity record found for presented assertion."}
	}
	return "aad-federated", nil
}

// imdsToken is GET /metadata/identity/oauth2/token, the managed identity's
// token from the instance metadata service. Numbers are strings, as IMDS sends them.
func (s *server) imdsToken(w http.ResponseWriter, r *http.Request) {
	if e := checkIMDSRequest(r); e != nil {
		writeOAuthError(w, e)
		return
	}
	q := r.URL.Query()
	clientID := q.Get("client_id")
	if clientID == "" {
		clientID = defaultMIClientID
	}
	t := s.issue("mi", clientID)
	ttl := strconv.Itoa(int(s.cfg.tokenTTL.Seconds()))
	writeJSON(w, http.StatusOK, map[string]string{
		"access_token": t.Token, "client_id": clientID, "expires_in": ttl, "ext_expires_in": ttl,
		"expires_on": strconv.FormatInt(t.ExpiresAt.Unix(), 10), "not_before": strconv.FormatInt(t.IssuedAt.Unix(), 10),
		"resource": q.Get("resource"), "token_type": "Bearer",
	})
}

// checkIMDSRequest wants the Metadata: true header, an api-version and ARM as
// the resource.
func checkIMDSRequest(r *http.Request) *oauthError {
	q := r.URL.Query()
	switch resource := q.Get("resource"); {
	case !strings.EqualFold(r.Header.Get("Metadata"), "true"):
		return &oauthError{http.StatusBadRequest, "bad_request", "Required metadata header not specified"}
	case q.Get("api-version") == "":
		return &oauthError{http.StatusBadRequest, "bad_request", "Required query variable 'api-version' is missing"}
	case resource == "":
		return &oauthError{http.StatusBadRequest, "invalid_request", "Required query variable 'resource' is missing"}
	case resource != managementResource && resource != strings.TrimSuffix(managementResource, "/"):
		return &oauthError{http.StatusBadRequest, "invalid_resource",
			"AADSTS500011: The resource principal named " + resource + " was not found in the tenant."}
	}
	return nil
}
