package config

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TestTCPInClearTextOnlyOnLoopback: a TCP address other than loopback
// needs TLS or an explicit --insecure-tcp, and the error says so.
func TestTCPInClearTextOnlyOnLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:7777": true, "127.9.9.9:1": true, "[::1]:7777": true, "localhost:7777": true,
		"0.0.0.0:7777": false, ":7777": false, "192.0.2.1:7777": false, "[::]:7777": false, "example.com:7777": false,
	} {
		c := Default()
		c.TCPAddr = addr
		err := c.Validate()
		if ok != (err == nil) {
			t.Errorf("%s without TLS: %v, want ok %v", addr, err, ok)
		}
		if !ok && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--insecure-tcp")) {
			t.Errorf("%s: error %q does not name --insecure-tcp", addr, err)
		}
		c.InsecureTCP = true
		if err := c.Validate(); err != nil {
			t.Errorf("%s with --insecure-tcp: %v", addr, err)
		}
		c.InsecureTCP = false
		c.TLSCertFile, c.TLSKeyFile = "/etc/ab/cert.pem", "/etc/ab/key.pem"
		if err := c.Validate(); err != nil {
			t.Errorf("%s with TLS: %v", addr, err)
		}
	}
}

func TestValidateTCPEdgeRejects(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"cert without key":   func(c *Config) { c.TLSCertFile = "/c.pem" },
		"key without cert":   func(c *Config) { c.TLSKeyFile = "/k.pem" },
		"relative cert":      func(c *Config) { c.TLSCertFile, c.TLSKeyFile = "c.pem", "/k.pem" },
		"negative conns":     func(c *Config) { c.MaxConns = -1 },
		"negative per addr":  func(c *Config) { c.MaxConnsPerAddr = -1 },
		"negative rate":      func(c *Config) { c.TCPRequestRate = -1 },
		"e2b not host:port":  func(c *Config) { c.E2BAddr = "nope" },
		"e2b in clear text":  func(c *Config) { c.E2BAddr = "0.0.0.0:3000" },
		"e2b mapping":        func(c *Config) { c.E2BTemplates = []string{"base"} },
		"e2b empty template": func(c *Config) { c.E2BTemplates = []string{"base="} },
	} {
		c := Default()
		mutate(c)
		if err := c.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

func TestTCPEdgeEnv(t *testing.T) {
	t.Setenv(EnvTCP, "0.0.0.0:7777")
	t.Setenv(EnvTLSCert, "/etc/ab/cert.pem")
	t.Setenv(EnvTLSKey, "/etc/ab/key.pem")
	t.Setenv(EnvInsecureTCP, "true")
	c := Default()
	c.ApplyEnv()
	if !c.TLS() || c.TLSKeyFile != "/etc/ab/key.pem" || !c.InsecureTCP {
		t.Fatalf("env not applied: %+v", c.TCPEdge)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
