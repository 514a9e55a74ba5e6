package ring

import "errors"

// ErrNoMembers is returned by New when the member list is empty: a ring with
// no members has no owner for any key.
var ErrNoMembers = errors.New("ring: no members")

// ErrInvalidMember is returned (wrapped, naming the member) by New when a
// member name is empty or appears more than once, or when the names cannot
// be placed on the ring.
var ErrInvalidMember = errors.New("ring: invalid member")

// ErrInvalidConfig is returned (wrapped, one error per problem, joined) by
// Config.Validate and New when a ring parameter is out of range.
var ErrInvalidConfig = errors.New("ring: invalid config")
