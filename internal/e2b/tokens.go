package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// tokens mints and checks envd access tokens. A token is
// base64url(tenant) "." base64url(HMAC-SHA256(key, "envd" 0 tenant 0
// sandbox)): it names the sandbox owner, so sandbox traffic (which
// carries no API key) runs as that tenant, and it is valid for that one
// sandbox only. Stateless: the same sandbox always gets the same token
// under one key; deleting the sandbox makes every call with it fail as
// not found.
type tokens struct{ key []byte }

func (t tokens) mac(owner, sandbox string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte("envd\x00" + owner + "\x00" + sandbox))
	return m.Sum(nil)
}

// mint returns the token of sandbox, owned by owner.
func (t tokens) mint(owner, sandbox string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(owner)) + "." + enc.EncodeToString(t.mac(owner, sandbox))
}

// check returns the owner named by tok when tok is sandbox's token.
func (t tokens) check(tok, sandbox string) (string, error) {
	enc := base64.RawURLEncoding
	o, m, ok := strings.Cut(tok, ".")
	if !ok {
		return "", fmt.Errorf("malformed access token: %w", errdefs.ErrUnauthenticated)
	}
	owner, err1 := enc.DecodeString(o)
	sum, err2 := enc.DecodeString(m)
	if err1 != nil || err2 != nil || !hmac.Equal(sum, t.mac(string(owner), sandbox)) {
		return "", fmt.Errorf("invalid access token for sandbox %s: %w", sandbox, errdefs.ErrUnauthenticated)
	}
	return string(owner), nil
}
