//go:build race

package sim

const raceOn = true
