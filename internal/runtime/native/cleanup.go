package native

// cleanupStack undoes the steps of a half-built sandbox in reverse order,
// unless released (gVisor pkg/cleanup style):
//
//	var c cleanupStack
//	defer c.run()
//	...; c.add(undo)
//	c.release()
type cleanupStack struct {
	fns []func()
}

func (c *cleanupStack) add(f func()) { c.fns = append(c.fns, f) }

// release forgets every step: the object is complete.
func (c *cleanupStack) release() { c.fns = nil }

// run undoes every remaining step, last first.
func (c *cleanupStack) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}
