package secrets

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func validClaims(exp time.Time) RunClaims {
	return RunClaims{
		Tenant: "admin", Sandbox: "sbA", Run: "run1", Boot: "boot1",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)},
	}
}

func TestTokenRoundTrip(t *testing.T) {
	tk := NewTokens(testKey(t))
	tok, err := tk.Mint(validClaims(time.Now().Add(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := tk.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sandbox != "sbA" || c.Run != "run1" || c.Boot != "boot1" || c.Tenant != "admin" || c.Type != TokenTypeRun || c.Issuer != TokenIssuer {
		t.Fatalf("claims %+v", c)
	}
	if _, err := tk.Mint(RunClaims{Sandbox: "x"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("incomplete claims: %v", err)
	}
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

func TestTokenRejections(t *testing.T) {
	key := testKey(t)
	tk := NewTokens(key)
	good, _ := tk.Mint(validClaims(time.Now().Add(time.Minute)))
	parts := strings.Split(good, ".")

	sign := func(method jwt.SigningMethod, key any, claims jwt.Claims) string {
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := validClaims(time.Now().Add(time.Minute))
	base.Type, base.Issuer, base.ID = TokenTypeRun, TokenIssuer, "run1"
	base.Audience = jwt.ClaimStrings{TokenAudience}

	wrongAud := base
	wrongAud.Audience = jwt.ClaimStrings{"someone-else"}
	wrongIss := base
	wrongIss.Issuer = "evil"
	wrongTyp := base
	wrongTyp.Type = "session"
	noExp := base
	noExp.ExpiresAt = nil

	expired, _ := tk.Mint(validClaims(time.Now().Add(-time.Second)))
	other, _ := NewTokens(testKey(t)).Mint(validClaims(time.Now().Add(time.Minute)))

	cases := map[string]string{
		"alg none":        b64(map[string]string{"alg": "none", "typ": "JWT"}) + "." + parts[1] + ".",
		"alg none signed": sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, base),
		"HS512 same key":  sign(jwt.SigningMethodHS512, key.Derive(purposeTokens), base),
		"wrong audience":  sign(jwt.SigningMethodHS256, key.Derive(purposeTokens), wrongAud),
		"wrong issuer":    sign(jwt.SigningMethodHS256, key.Derive(purposeTokens), wrongIss),
		"wrong typ":       sign(jwt.SigningMethodHS256, key.Derive(purposeTokens), wrongTyp),
		"no expiry":       sign(jwt.SigningMethodHS256, key.Derive(purposeTokens), noExp),
		"expired":         expired,
		"other key":       other,
		"master key":      sign(jwt.SigningMethodHS256, key.b[:], base),
		"tampered":        parts[0] + "." + b64(map[string]any{"typ": "run", "sandbox": "sbB", "run": "run1", "boot": "boot1", "iss": TokenIssuer, "aud": TokenAudience, "jti": "run1", "exp": time.Now().Add(time.Hour).Unix()}) + "." + parts[2],
		"garbage":         "not.a.token",
		"empty":           "",
	}
	for name, tok := range cases {
		if _, err := tk.Verify(tok); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Verify = %v, want unauthenticated", name, err)
		}
	}
}
