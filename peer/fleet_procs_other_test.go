//go:build !linux

package peer

import "syscall"

// fleetSysProcAttr: only Linux can have a child killed with its parent;
// elsewhere the test's cleanup alone stops the fleet.
func fleetSysProcAttr() *syscall.SysProcAttr { return nil }
