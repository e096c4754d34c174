package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// tokens mints and checks a sandbox's access tokens. A token is
// base64url(tenant) "." base64url(HMAC-SHA256(key, purpose 0 tenant 0
// sandbox)): it names the sandbox owner, so sandbox traffic (which
// carries no API key) runs as that tenant, and it is valid for that one
// sandbox and that one purpose only. Stateless: the same sandbox always
// gets the same token under one key; deleting the sandbox makes every
// call with it fail as not found.
type tokens struct{ key []byte }

// Purposes of a token.
const (
	// purposeEnvd is the envd access token (X-Access-Token): every port
	// of the sandbox, envd's included.
	purposeEnvd = "envd"
	// purposeTraffic is the traffic access token
	// (E2B-Traffic-Access-Token): the ports served by a PortHandler (the
	// code interpreter's), never envd's, so it cannot run commands.
	purposeTraffic = "traffic"
)

func (t tokens) mac(purpose, owner, sandbox string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte(purpose + "\x00" + owner + "\x00" + sandbox))
	return m.Sum(nil)
}

// mint returns the envd access token of sandbox, owned by owner.
func (t tokens) mint(owner, sandbox string) string { return t.mintFor(purposeEnvd, owner, sandbox) }

// mintFor returns the token of sandbox for purpose, owned by owner.
func (t tokens) mintFor(purpose, owner, sandbox string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(owner)) + "." + enc.EncodeToString(t.mac(purpose, owner, sandbox))
}

// check returns the owner named by tok when tok is sandbox's envd access
// token.
func (t tokens) check(tok, sandbox string) (string, error) {
	return t.checkFor(purposeEnvd, tok, sandbox)
}

// checkFor returns the owner named by tok when tok is sandbox's token
// for purpose.
func (t tokens) checkFor(purpose, tok, sandbox string) (string, error) {
	o, _, ok := strings.Cut(tok, ".")
	if !ok {
		return "", fmt.Errorf("malformed access token: %w", errdefs.ErrUnauthenticated)
	}
	owner, err := base64.RawURLEncoding.Strict().DecodeString(o)
	// Only the one spelling minted is accepted (base64 decoding alone
	// would let other spellings of the same bytes through: newlines,
	// non-zero trailing bits).
	if err != nil || subtle.ConstantTimeCompare([]byte(tok), []byte(t.mintFor(purpose, string(owner), sandbox))) != 1 {
		return "", fmt.Errorf("invalid access token for sandbox %s: %w", sandbox, errdefs.ErrUnauthenticated)
	}
	return string(owner), nil
}
