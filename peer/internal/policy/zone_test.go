package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

func calendarConfig() Config {
	return Config{Limit: 1000, Algorithm: shard.Calendar, Period: shard.CalendarMonth, Zone: "Europe/Berlin"}
}

// TestCalendarVersion: peers with other calendar settings have another
// version; "" and "UTC" are one zone.
func TestCalendarVersion(t *testing.T) {
	pv := func(edit func(*Config)) uint64 {
		p := calendarConfig()
		edit(&p)
		return New(map[string]Config{"monthly": p}).Version()
	}
	want := pv(func(*Config) {})
	cases := []struct {
		name string
		edit func(*Config)
		same bool
	}{
		{"nothing", func(*Config) {}, true},
		{"period", func(p *Config) { p.Period = shard.CalendarYear }, false},
		{"zone", func(p *Config) { p.Zone = "America/New_York" }, false},
		{"limit", func(p *Config) { p.Limit = 999 }, false},
	}
	for _, tc := range cases {
		if got := pv(tc.edit); (got == want) != tc.same {
			t.Errorf("%s: version %x vs base %x, want same=%v", tc.name, got, want, tc.same)
		}
	}
	utc := func(zone string) uint64 { return pv(func(p *Config) { p.Zone = zone }) }
	if utc("") != utc("UTC") {
		t.Error(`zone "" and "UTC" have different versions`)
	}
	if utc("") == want {
		t.Error("UTC and Europe/Berlin have one version")
	}
}

// TestCalendarValidate: unknown zones, "Local", calendar fields on other
// algorithms and a missing period are each one error naming what to write.
func TestCalendarValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string // substring of the one error; "" means valid
	}{
		{"valid", func(*Config) {}, ""},
		{"utc", func(p *Config) { p.Zone = "" }, ""},
		{"unknown zone", func(p *Config) { p.Zone = "Europe/Berln" }, `unknown time zone "Europe/Berln": use an IANA name such as "Europe/Berlin"`},
		{"local zone", func(p *Config) { p.Zone = "Local" }, `zone "Local" depends on the host`},
		{"no period", func(p *Config) { p.Period = 0 }, "calendar policy needs a period (calendar_day, calendar_week, calendar_month or calendar_year)"},
		{"window", func(p *Config) { p.Window = time.Hour }, "leave window (1h0m0s) and resolution (0s) zero"},
		{"zone on sliding log", func(p *Config) { p.Algorithm, p.Period, p.Window = shard.SlidingLog, 0, time.Hour }, `zone "Europe/Berlin" applies to algorithm calendar only`},
		{"period on sliding log", func(p *Config) { p.Algorithm, p.Zone, p.Window = shard.SlidingLog, "", time.Hour }, "period calendar_month needs algorithm calendar"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := calendarConfig()
			tc.edit(&p)
			errs := Validate(map[string]Config{"monthly": p})
			switch {
			case tc.want == "" && len(errs) != 0:
				t.Fatalf("Validate(%+v) = %v, want none", p, errs)
			case tc.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want)):
				t.Fatalf("Validate(%+v) = %v, want one error containing %q", p, errs, tc.want)
			}
		})
	}
}

// TestCalendarEntry: the compiled entry carries the loaded zone.
func TestCalendarEntry(t *testing.T) {
	e := New(map[string]Config{"monthly": calendarConfig()}).Lookup("monthly")
	if e.Shard.Algorithm != shard.Calendar || e.Shard.Period != shard.CalendarMonth || e.Shard.Zone == nil || e.Shard.Zone.String() != "Europe/Berlin" {
		t.Fatalf("entry shard policy %+v, want calendar_month in Europe/Berlin", e.Shard)
	}
	if err := e.Shard.Validate(); err != nil {
		t.Fatal(err)
	}
	if z, _ := LoadZone(""); z != time.UTC {
		t.Fatalf(`LoadZone("") = %v, want UTC`, z)
	}
}
