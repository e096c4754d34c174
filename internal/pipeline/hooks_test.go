package pipeline

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func newHooks(t *testing.T, e *env) *Hooks {
	t.Helper()
	h, err := NewHooks(e.p, bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHookSignatureReplayAndStaleness(t *testing.T) {
	e := newEnv(t)
	h := newHooks(t, e)
	ctx := context.Background()
	hk, err := h.Create(ctx, api.CreateHookRequest{RunAction: api.RunAction{Template: "busybox", Command: "cat"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(hk.Secret) < 40 {
		t.Fatalf("secret %q", hk.Secret)
	}
	// The secret is shown once and stored sealed, never in the clear.
	if got, _ := h.Get(ctx, hk.ID); got.Secret != "" {
		t.Fatal("Get shows the secret")
	}
	rec, _ := e.st.GetHook(ctx, hk.ID)
	if bytes.Contains(rec.SealedSecret, []byte(hk.Secret)) || len(rec.SealedSecret) == 0 {
		t.Fatal("secret stored in the clear")
	}
	body := []byte(`{"event":"push"}`)
	now := e.clk.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	good := Sign(hk.Secret, now, body)

	isUnauth := func(err error) bool { return errors.Is(err, errdefs.ErrUnauthenticated) }
	for name, c := range map[string]struct {
		id, ts, sig string
		body        []byte
	}{
		"wrong secret":    {hk.ID, ts, Sign("whsec_other", now, body), body},
		"body changed":    {hk.ID, ts, good, []byte(`{"event":"push!"}`)},
		"timestamp moved": {hk.ID, strconv.FormatInt(now+1, 10), good, body},
		"no signature":    {hk.ID, ts, "", body},
		"no timestamp":    {hk.ID, "", good, body},
		"unknown hook":    {"hook_00000000000000000000", ts, good, body},
		"stale":           {hk.ID, strconv.FormatInt(now-301, 10), Sign(hk.Secret, now-301, body), body},
		"future":          {hk.ID, strconv.FormatInt(now+301, 10), Sign(hk.Secret, now+301, body), body},
	} {
		if _, err := h.Invoke(ctx, c.id, c.ts, c.sig, c.body, true); !isUnauth(err) {
			t.Errorf("%s: %v, want unauthenticated", name, err)
		}
	}
	if n := e.sbx.execCount(); n != 0 {
		t.Fatalf("rejected requests ran %d commands", n)
	}
	// Within the window (a 4-minute-old signature) it runs, with the body
	// as stdin, once.
	e.clk.Advance(4 * time.Minute)
	r, err := h.Invoke(ctx, hk.ID, ts, good, body, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Trigger != api.TriggerWebhook || r.Who != "hook:"+hk.ID || r.State != api.RunFinished || !bytes.Equal(r.Output, body) {
		t.Fatalf("run %+v", r)
	}
	if ex := e.sbx.execs[0]; !bytes.Equal(ex.Stdin, body) || ex.Env[api.HookIDEnv] != hk.ID || ex.Command != "cat" {
		t.Fatalf("exec %+v", ex)
	}
	if _, err := h.Invoke(ctx, hk.ID, ts, good, body, true); !errdefs.IsConflict(err) {
		t.Fatalf("replay: %v", err)
	}
	// Past the window the same request is stale, not a replay.
	e.clk.Advance(2 * time.Minute)
	if _, err := h.Invoke(ctx, hk.ID, ts, good, body, true); !isUnauth(err) {
		t.Fatalf("stale replay: %v", err)
	}
	// A fresh signature of the same body is a new delivery.
	now2 := e.clk.Now().Unix()
	if _, err := h.Invoke(ctx, hk.ID, strconv.FormatInt(now2, 10), Sign(hk.Secret, now2, body), body, false); err != nil {
		t.Fatal(err)
	}
	h.Wait()
	if n := e.sbx.execCount(); n != 2 {
		t.Fatalf("runs %d", n)
	}
	if got, _ := h.Get(ctx, hk.ID); got.LastRunID == "" {
		t.Fatal("last run not noted")
	}
	// Deleted hooks refuse like unknown ones.
	if err := h.Delete(ctx, hk.ID); err != nil {
		t.Fatal(err)
	}
	now3 := e.clk.Now().Unix()
	if _, err := h.Invoke(ctx, hk.ID, strconv.FormatInt(now3, 10), Sign(hk.Secret, now3, body), body, true); !isUnauth(err) {
		t.Fatalf("deleted hook: %v", err)
	}
}

// A daemon with another secrets key cannot open the stored secrets.
func TestHookSecretBoundToKey(t *testing.T) {
	e := newEnv(t)
	h := newHooks(t, e)
	ctx := context.Background()
	hk, err := h.Create(ctx, api.CreateHookRequest{RunAction: api.RunAction{Command: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewHooks(e.p, bytes.Repeat([]byte{8}, 32))
	now := e.clk.Now().Unix()
	_, err = other.Invoke(ctx, hk.ID, strconv.FormatInt(now, 10), Sign(hk.Secret, now, nil), nil, true)
	if !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("wrong key: %v", err)
	}
}
