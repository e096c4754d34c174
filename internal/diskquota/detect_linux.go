package diskquota

import (
	"errors"
	"fmt"
	"path/filepath"
)

// ProjectTable is the name of the project method's table in the state dir.
const ProjectTable = "projects.json"

// Detect chooses the method for the sandbox dirs under sandboxes, with its
// state (loop images, the project table) in the directory state:
//
//   - Project when sandboxes is on XFS mounted with project quotas
//     enforced, unless loop images are in use (sandboxes made by an earlier
//     daemon keep the loop method until they are deleted);
//   - Loop otherwise, when loop devices and mkfs.ext4 are there.
//
// why says why Project was not chosen (nil when it was); q is nil, and why
// says why, when neither works here.
func Detect(sandboxes, state string) (q Quota, why error) {
	imgs, err := imageIDs(state)
	switch {
	case err != nil:
		why = err
	case len(imgs) > 0:
		why = fmt.Errorf("%d sandbox(es) have loop images in %s: the loop method stays until they are deleted", len(imgs), state)
	default:
		p, err := OpenProject(sandboxes, filepath.Join(state, ProjectTable))
		if err == nil {
			return p, nil
		}
		why = err
	}
	l, err := NewLoop(state)
	if err != nil {
		return nil, errors.Join(why, err)
	}
	return l, why
}
