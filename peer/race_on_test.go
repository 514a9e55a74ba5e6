//go:build race

package peer

const raceEnabled = true
