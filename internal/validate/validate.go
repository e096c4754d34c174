// Package validate holds agentbox's one set of rules for environment
// variables and labels (and the shape of a template reference), shared by
// the API edge (httpapi), sandbox creation, exec and fork (sandbox),
// templates, warm pools and the guest. It is a leaf: it imports only
// errdefs and lazyregexp, so the guest may use it too.
//
// There are two rules for environments, for two kinds of source:
//
//   - Env is what a request may set (create, exec, fork, schedule and hook
//     actions): a bounded number of variables whose names are portable
//     shell identifiers.
//   - Environ is what a process environment can hold at all. Template and
//     image environments follow it: an OCI image config may name its
//     variables freely, and the guest applies it to every environment it
//     is handed.
//
// Every error wraps errdefs.ErrInvalidArgument and names the offending key
// (clipped to a readable length).
package validate

import (
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// Limits of Env and Labels.
const (
	MaxEnv           = 256      // variables in one request's environment
	MaxLabels        = 64       // labels on one sandbox or checkpoint
	MaxKeyLen        = 128      // bytes of a variable name or label key
	MaxValueLen      = 32 << 10 // bytes of a variable's value
	MaxLabelValueLen = 1024     // bytes of a label's value
)

var (
	envNameRE  = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// clipLen bounds a key quoted in an error message.
const clipLen = 64

func clip(s string) string {
	if len(s) <= clipLen {
		return s
	}
	return s[:clipLen] + "..."
}

// EnvName returns an error unless name is a variable name a request may
// set: at most MaxKeyLen bytes of [A-Za-z_][A-Za-z0-9_]*.
func EnvName(name string) error {
	if len(name) > MaxKeyLen || !envNameRE.MatchString(name) {
		return fmt.Errorf("environment variable name %q is not valid: %w", clip(name), errdefs.ErrInvalidArgument)
	}
	return nil
}

// EnvValue returns an error unless v fits in a request's environment as
// the value of name: at most MaxValueLen bytes, no NUL.
func EnvValue(name, v string) error {
	if len(v) > MaxValueLen || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("environment variable %s: value is not valid: %w", clip(name), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Env returns an error unless env is an environment a request may set: at
// most MaxEnv variables, each name passing EnvName and each value
// EnvValue. A nil map is valid.
func Env(env map[string]string) error {
	if len(env) > MaxEnv {
		return fmt.Errorf("at most %d environment variables: %w", MaxEnv, errdefs.ErrInvalidArgument)
	}
	for k, v := range env {
		if err := EnvName(k); err != nil {
			return err
		}
		if err := EnvValue(k, v); err != nil {
			return err
		}
	}
	return nil
}

// Environ returns an error unless every variable of env can be written
// into a process environment as NAME=VALUE: a non-empty name without '='
// or NUL, a value without NUL. It bounds neither count nor length (see
// Env for requests). A nil map is valid.
func Environ(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("environment variable name %q is not valid: %w", clip(k), errdefs.ErrInvalidArgument)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("environment variable %s: value is not valid: %w", clip(k), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Labels returns an error unless labels can be set on a sandbox or a
// checkpoint: at most MaxLabels, keys of at most MaxKeyLen bytes of
// [A-Za-z0-9][A-Za-z0-9._/-]*, values of at most MaxLabelValueLen bytes
// without NUL. A nil map is valid.
func Labels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("at most %d labels: %w", MaxLabels, errdefs.ErrInvalidArgument)
	}
	for k, v := range labels {
		if len(k) > MaxKeyLen || !labelKeyRE.MatchString(k) {
			return fmt.Errorf("label key %q is not valid: %w", clip(k), errdefs.ErrInvalidArgument)
		}
		if len(v) > MaxLabelValueLen || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("label %q: value is not valid: %w", clip(k), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
