package policy

import (
	"fmt"
	"time"

	// Calendar policies name IANA zones; the embedded copy of the zone
	// database means a host without zoneinfo (a scratch container) still
	// knows them. It is a fallback: time.LoadLocation prefers the host's
	// files, so nodes whose zoneinfo disagree about a zone's rules could
	// disagree about its boundaries (the version compares zone names, not
	// rules).
	_ "time/tzdata"
)

// LoadZone returns the location of an IANA zone name for a Calendar
// policy; empty means UTC. "Local" is refused: it is whatever the host is
// set to, so two nodes could count different days. The error names what
// to write instead.
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, fmt.Errorf(`zone "Local" depends on the host; name an IANA zone such as "Europe/Berlin", or leave it empty for UTC`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf(`unknown time zone %q: use an IANA name such as "Europe/Berlin" or "America/New_York", or leave it empty for UTC`, name)
	}
	return loc, nil
}
