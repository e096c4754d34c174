package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// LoadConnectors reads a JSON array of Connector from path ("" → none).
// Unknown fields are errors, so a typo cannot silently drop a setting.
func LoadConnectors(path string) ([]Connector, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading connectors file: %w", err)
	}
	var cs []Connector
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cs); err != nil {
		return nil, fmt.Errorf("connectors file %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	for _, c := range cs {
		if err := ValidConnector(c); err != nil {
			return nil, fmt.Errorf("connectors file %s: %w", path, err)
		}
	}
	return cs, nil
}
