package main

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

const jwtBearerGrant = "urn:ietf:params:oauth:grant-type:jwt-bearer"

// computeScopes are the scopes that allow Compute Engine calls.
var computeScopes = []string{
	"https://www.googleapis.com/auth/compute",
	"https://www.googleapis.com/auth/cloud-platform",
}

// authorize records the compute call's Authorization header and, with
// -require-token, rejects it (401, as Google's front end) unless it carries a
// live token this fake issued.
func (s *server) authorize(r *http.Request) error {
	header := r.Header.Get("Authorization")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authHeaders = append(s.authHeaders, header)
	if !s.cfg.requireToken {
		return nil
	}
	if header == "" {
		return &apiError{status: http.StatusUnauthorized, reason: "required", location: "Authorization",
			message: "Request is missing required authentication credential. Expected OAuth 2 access token, " +
				"login cookie or other valid authentication credential."}
	}
	token, ok := strings.CutPrefix(header, "Bearer ")
	if t := s.issued(token); !ok || t == nil || time.Now().After(t.ExpiresAt) {
		return &apiError{status: http.StatusUnauthorized, reason: "authError", location: "Authorization",
			message: "Request had invalid authentication credentials. Expected OAuth 2 access token, " +
				"login cookie or other valid authentication credential."}
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

// callerEmail is the operation's "user": the subject of the caller's token.
func (s *server) callerEmail(r *http.Request) string {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if t := s.issued(token); t != nil && strings.Contains(t.Subject, "@") {
		return t.Subject
	}
	return "fake-user@example.com"
}

// issue makes a token of this kind (sa, user, md) and answers it as Google's
// token endpoints do.
func (s *server) issue(w http.ResponseWriter, kind, subject, scope string) {
	s.mu.Lock()
	now := time.Now()
	t := &issuedToken{Token: fmt.Sprintf("fake-%s-%d", kind, len(s.tokens)+1), Kind: kind,
		Subject: subject, Scope: scope, IssuedAt: now, ExpiresAt: now.Add(s.cfg.tokenTTL)}
	s.tokens = append(s.tokens, t)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": t.Token, "expires_in": int(s.cfg.tokenTTL.Seconds()), "token_type": "Bearer",
	})
}

func oauthError(w http.ResponseWriter, status int, code, description string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": description})
}

// oauthToken is POST /token, Google's OAuth token endpoint: the JWT-bearer
// grant of a service-account key, or a user's refresh token.
func (s *server) oauthToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	form := r.PostForm
	switch grant := form.Get("grant_type"); grant {
	case jwtBearerGrant:
		claims, err := s.verifyAssertion(form.Get("assertion"), r.Host, time.Now())
		if err != nil {
			oauthError(w, http.StatusBadRequest, "invalid_grant", err.Error())
			return
		}
		s.issue(w, "sa", claims.Iss, claims.Scope)
	case "refresh_token":
		for _, field := range []string{"client_id", "client_secret", "refresh_token"} {
			if form.Get(field) == "" {
				oauthError(w, http.StatusBadRequest, "invalid_request", field+" is missing.")
				return
			}
		}
		s.issue(w, "user", form.Get("client_id"), "")
	default:
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+grant)
	}
}

// jwtClaims are the claims of a service account's token request.
type jwtClaims struct {
	Iss   string `json:"iss"`
	Scope string `json:"scope"`
	Aud   string `json:"aud"`
	Iat   int64  `json:"iat"`
	Exp   int64  `json:"exp"`
}

// verifyAssertion checks the JWT as Google does: RS256 over header.payload
// with the service account's key, then its claims.
func (s *server) verifyAssertion(assertion, host string, now time.Time) (*jwtClaims, error) {
	parts := strings.Split(assertion, ".")
	if len(parts) != 3 {
		return nil, errors.New("Invalid JWT: assertion is not header.payload.signature")
	}
	var header struct{ Alg, Typ string }
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg != "RS256" || header.Typ != "JWT" {
		return nil, errors.New("Invalid JWT header: want alg RS256 and typ JWT")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, errors.New("Invalid JWT Signature.")
	}
	if s.cfg.saPublicKey == nil {
		return nil, errors.New("Invalid JWT Signature. (the fake has no -sa-public-key)")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(s.cfg.saPublicKey, crypto.SHA256, digest[:], sig) != nil {
		return nil, errors.New("Invalid JWT Signature.")
	}
	var claims jwtClaims
	if err := decodeSegment(parts[1], &claims); err != nil {
		return nil, errors.New("Invalid JWT: payload is not a JSON object of claims")
	}
	return &claims, checkClaims(&claims, host, now)
}

func decodeSegment(seg string, v any) error {
	data, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// checkClaims wants an issuer, a compute scope, this token URL as audience
// and a short-lived, current token (iat within 5 minutes, exp at most an hour on).
func checkClaims(c *jwtClaims, host string, now time.Time) error {
	if c.Iss == "" {
		return errors.New("Invalid JWT: No issuer (iss) claim.")
	}
	if !slices.ContainsFunc(strings.Fields(c.Scope), func(sc string) bool { return slices.Contains(computeScopes, sc) }) {
		return errors.New("Invalid JWT: scope must include " + strings.Join(computeScopes, " or "))
	}
	if c.Aud != "http://"+host+"/token" && c.Aud != "https://oauth2.googleapis.com/token" {
		return fmt.Errorf("Invalid JWT: Failed audience check. want http://%s/token or https://oauth2.googleapis.com/token", host)
	}
	skew := now.Unix() - c.Iat
	if skew > 300 || skew < -300 || c.Exp <= c.Iat || c.Exp-c.Iat > 3600 || c.Exp <= now.Unix() {
		return errors.New("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable " +
			"timeframe. Check your iat and exp values in the JWT claim.")
	}
	return nil
}

// metadataFlavor rejects, as the metadata server does, a request without
// "Metadata-Flavor: Google", and marks the answer as the server's.
func metadataFlavor(w http.ResponseWriter, r *http.Request) bool {
	w.Header().Set("Metadata-Flavor", "Google")
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing required header: Metadata-Flavor", http.StatusForbidden)
		return false
	}
	return true
}

// metadataToken is the instance's default service account token.
func (s *server) metadataToken(w http.ResponseWriter, r *http.Request) {
	if metadataFlavor(w, r) {
		s.issue(w, "md", "default", r.URL.Query().Get("scopes"))
	}
}

func (s *server) metadataProjectID(w http.ResponseWriter, r *http.Request) {
	if metadataFlavor(w, r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(s.cfg.metadataProject))
	}
}
