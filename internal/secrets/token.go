package secrets

import (
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Fixed values of run tokens.
const (
	TokenIssuer   = "agentbox"
	TokenAudience = "agentbox-bridge"
	TokenTypeRun  = "run"
	purposeTokens = "agentbox run tokens v1 HS256"
)

// RunClaims are the claims of a per-run bridge token. The run id is also
// the JWT id (jti).
type RunClaims struct {
	Type    string `json:"typ"`
	Tenant  string `json:"tenant"`
	Sandbox string `json:"sandbox"`
	Run     string `json:"run"`
	// Boot is the sandbox's boot id when the token was minted; it changes
	// at every start of the sandbox (restart recovery, restore, fork), so a
	// token copied along with a sandbox's memory or files is dead in the
	// copy.
	Boot string `json:"boot"`
	jwt.RegisteredClaims
}

// Tokens mints and verifies run tokens: HS256 with a key derived from the
// master key (outside the data dir). Verification pins the algorithm (alg
// "none" and every other algorithm are refused before any key is used) and
// checks issuer, audience, type, expiry (required) and the presence of the
// sandbox, run and boot claims. Whether the run is still live is the
// caller's check (the Manager knows).
//
// Safe for concurrent use.
type Tokens struct {
	key []byte
	now func() time.Time
}

// NewTokens returns a minter/verifier keyed by k.
func NewTokens(k Key) *Tokens {
	return &Tokens{key: k.Derive(purposeTokens), now: time.Now}
}

// Mint signs a token for c. Type, issuer, audience, issued-at and the JWT id
// (= c.Run) are set here; c.ExpiresAt is required.
func (t *Tokens) Mint(c RunClaims) (string, error) {
	if c.Sandbox == "" || c.Run == "" || c.Boot == "" || c.ExpiresAt == nil {
		return "", fmt.Errorf("minting run token: sandbox, run, boot and expiry are required: %w", errdefs.ErrInvalidArgument)
	}
	c.Type = TokenTypeRun
	c.Issuer = TokenIssuer
	c.Audience = jwt.ClaimStrings{TokenAudience}
	c.ID = c.Run
	c.IssuedAt = jwt.NewNumericDate(t.now())
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("minting run token: %w", err)
	}
	return s, nil
}

// Verify checks a token and returns its claims. Every failure wraps
// errdefs.ErrUnauthenticated and says nothing of the token's content.
func (t *Tokens) Verify(token string) (RunClaims, error) {
	var c RunClaims
	_, err := jwt.ParseWithClaims(token, &c, func(tok *jwt.Token) (any, error) {
		if tok.Method != jwt.SigningMethodHS256 {
			return nil, fmt.Errorf("unexpected signing method")
		}
		return t.key, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithIssuer(TokenIssuer),
		jwt.WithAudience(TokenAudience),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(t.now),
	)
	if err != nil {
		return RunClaims{}, fmt.Errorf("run token rejected: %v: %w", err, errdefs.ErrUnauthenticated)
	}
	if c.Type != TokenTypeRun || c.Sandbox == "" || c.Run == "" || c.Boot == "" || c.ID != c.Run {
		return RunClaims{}, fmt.Errorf("run token rejected: not a run token: %w", errdefs.ErrUnauthenticated)
	}
	return c, nil
}
