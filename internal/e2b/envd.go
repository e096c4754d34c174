package e2b

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// The envd API, as E2B's SDK speaks it: the Connect services
// process.Process and filesystem.Filesystem with the JSON codec over
// HTTP/1.1 (connectrpc.com/connect), and REST /files and /health.
//
// The messages are hand-written Go types whose encoding/json form is the
// protobuf JSON mapping of E2B's envd .proto definitions (camelCase
// names, bytes in base64, oneofs as one set field, enums by name), read
// with jsonCodec; there is no generated code and no protoc step. Only
// the JSON codec is offered: the SDK's transport uses it
// (useBinaryFormat: false), and a client asking for binary protobuf is
// refused by the codec.

// jsonCodec is the Connect codec "json" over encoding/json.
type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }

func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (jsonCodec) Unmarshal(b []byte, v any) error {
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding a message: %w", err)
	}
	return nil
}

// protoCodec answers a binary protobuf client that it is not served.
type protoCodec struct{}

func (protoCodec) Name() string { return "proto" }

func (protoCodec) Marshal(any) ([]byte, error) {
	return nil, fmt.Errorf("the binary protobuf codec is not served, use JSON: %w", errdefs.ErrNotImplemented)
}

func (protoCodec) Unmarshal([]byte, any) error {
	return fmt.Errorf("the binary protobuf codec is not served, use JSON: %w", errdefs.ErrNotImplemented)
}

// envdHandler routes envd's Connect procedures and REST paths.
func (s *Server) envdHandler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithCodec(jsonCodec{}), connect.WithCodec(protoCodec{})}
	s.processRoutes(mux, opts)
	s.filesystemRoutes(mux, opts)
	s.watchRoutes(mux, opts)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", s.readFile)
	mux.HandleFunc("POST /files", s.writeFiles)
	return mux
}

// userRE is the shape of a user name the SDK may name.
var userRE = lazyregexp.New(`^[a-z_][a-z0-9_-]{0,31}$`)

// userOf returns the user of an envd request: "Authorization: Basic
// base64(user:)" as the SDK sends it, or the username query parameter of
// /files; DefaultUser when neither is set.
func userOf(r *http.Request) (string, error) {
	if u := r.URL.Query().Get("username"); u != "" {
		return checkUser(u)
	}
	return userOfHeader(r.Header)
}

func userOfHeader(h http.Header) (string, error) {
	a := h.Get("Authorization")
	if a == "" {
		return DefaultUser, nil
	}
	scheme, cred, ok := strings.Cut(a, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", fmt.Errorf("authorization: want Basic user: %w", errdefs.ErrInvalidArgument)
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", fmt.Errorf("authorization: bad base64: %w", errdefs.ErrInvalidArgument)
	}
	u, _, _ := strings.Cut(string(b), ":")
	if u == "" {
		return DefaultUser, nil
	}
	return checkUser(u)
}

func checkUser(u string) (string, error) {
	if !userRE.MatchString(u) {
		return "", fmt.Errorf("user %q is not a valid user name: %w", u, errdefs.ErrInvalidArgument)
	}
	return u, nil
}

// homeOf is user's home directory by E2B's convention.
func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolvePath makes p absolute (relative to user's home, "~" its home)
// and clean, refusing NUL bytes and over-long paths.
func resolvePath(p, user string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", fmt.Errorf("path is not valid: %w", errdefs.ErrInvalidArgument)
	}
	switch {
	case p == "" || p == "~":
		p = homeOf(user)
	case strings.HasPrefix(p, "~/"):
		p = homeOf(user) + p[1:]
	case !strings.HasPrefix(p, "/"):
		p = homeOf(user) + "/" + p
	}
	return path.Clean(p), nil
}
