package daemon

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/console"
)

// consoleHandler is the web console of every API listener (docs/CONSOLE.md),
// or nil when the configuration turns it off.
func consoleHandler(cfg *config.Config) http.Handler {
	if cfg.ConsoleDisabled {
		return nil
	}
	return console.Handler()
}
