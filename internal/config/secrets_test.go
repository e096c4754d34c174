package config

import (
	"strings"
	"testing"
)

func TestSecretsKeyFileOutsideDataDir(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"/etc/agentbox/secrets.key", true},
		{"/var/lib/agentbox-keys/secrets.key", true},
		{"/var/lib/agentbox/secrets.key", false},
		{"/var/lib/agentbox/sub/../secrets.key", false},
		{"relative.key", false},
	} {
		c := Default()
		c.DataDir = "/var/lib/agentbox"
		c.SecretsKeyFile = tc.key
		err := c.Validate()
		if got := err == nil || !strings.Contains(err.Error(), "secrets key"); got != tc.ok {
			t.Errorf("key %q: err %v, want ok=%v", tc.key, err, tc.ok)
		}
	}
	c := Default()
	c.ConnectorsFile = "rel.json"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "connectors file") {
		t.Errorf("relative connectors file: %v", err)
	}
}
