package config

import "testing"

func TestServiceURLSettings(t *testing.T) {
	for _, d := range []string{"sb.example.com", "sb.example.com:8443", "a-b.c"} {
		if !validServiceDomain(d) {
			t.Errorf("validServiceDomain(%q) = false", d)
		}
	}
	for _, d := range []string{"", "localhost", "*.sb.example.com", "sb.example.com:0", "sb.example.com:080", "-a.b", "a..b", "a_b.c", "sb.example.com:x"} {
		if validServiceDomain(d) {
			t.Errorf("validServiceDomain(%q) = true", d)
		}
	}
	c := &Config{TCPAddr: "0.0.0.0:8443"}
	if got := c.ServicePublicURL(); got != "http://127.0.0.1:8443" {
		t.Errorf("ServicePublicURL from an unspecified host = %q", got)
	}
	c = &Config{TCPAddr: "10.0.0.1:8443", PublicURL: "https://box.example.com/"}
	if got := c.ServicePublicURL(); got != "https://box.example.com" {
		t.Errorf("ServicePublicURL with --public-url = %q", got)
	}
	if got := (&Config{}).ServicePublicURL(); got != "" {
		t.Errorf("ServicePublicURL without TCP = %q", got)
	}
}

func TestServiceURLSettingsValidated(t *testing.T) {
	for name, set := range map[string]func(c *Config){
		"domain":     func(c *Config) { c.ServiceDomain = "*.sb.example.com" },
		"url scheme": func(c *Config) { c.PublicURL = "ftp://box.example.com" },
		"url path":   func(c *Config) { c.PublicURL = "https://box.example.com/api" },
		"url user":   func(c *Config) { c.PublicURL = "https://u:p@box.example.com" },
	} {
		c := Default()
		set(c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c.Redacted())
		}
	}
	c := Default()
	c.ServiceDomain, c.PublicURL = "sb.example.com:8443", "https://box.example.com:8443"
	if err := c.Validate(); err != nil {
		t.Errorf("good settings refused: %v", err)
	}
}
