package validate

import (
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// templateRE is the shape of a template reference: [TENANT~]NAME[@VERSION].
var templateRE = lazyregexp.New(`^([a-z0-9][a-z0-9-]{0,31}~)?[a-z0-9][a-z0-9._-]{0,127}(@[a-z0-9]{1,64})?$`)

// TemplateRef returns an error unless name has the shape of a template
// reference, [TENANT~]NAME[@VERSION], as a create request or a warm pool
// names its template.
func TemplateRef(name string) error {
	if !templateRE.MatchString(name) {
		return fmt.Errorf("template name %q is not valid: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}
