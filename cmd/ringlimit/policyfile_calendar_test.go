package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// TestParseCalendarPolicies: a calendar window implies algorithm calendar,
// takes a zone, and every misuse is one error naming what to write.
func TestParseCalendarPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    map[string]peer.PolicyConfig
		wantErr string
	}{
		{
			name: "month in berlin, algorithm implied",
			in:   "policies:\n  - {name: monthly, limit: 1000000, window: calendar_month, zone: Europe/Berlin}\n",
			want: map[string]peer.PolicyConfig{"monthly": {Limit: 1000000, Algorithm: shard.Calendar, Period: shard.CalendarMonth, Zone: "Europe/Berlin"}},
		},
		{
			name: "week in utc, algorithm written",
			in:   `{"policies": [{"name": "weekly", "limit": 5, "window": "calendar_week", "algorithm": "calendar"}]}`,
			want: map[string]peer.PolicyConfig{"weekly": {Limit: 5, Algorithm: shard.Calendar, Period: shard.CalendarWeek}},
		},
		{
			name:    "unknown period",
			in:      "policies:\n  - {name: p, limit: 5, window: calendar_fortnight}\n",
			wantErr: `window "calendar_fortnight": want calendar_day, calendar_week, calendar_month or calendar_year`,
		},
		{
			name:    "unknown zone",
			in:      "policies:\n  - {name: p, limit: 5, window: calendar_day, zone: Europe/Berln}\n",
			wantErr: `zone "Europe/Berln" is not a known IANA time zone: write a name such as Europe/Berlin`,
		},
		{
			name:    "local zone",
			in:      "policies:\n  - {name: p, limit: 5, window: calendar_day, zone: Local}\n",
			wantErr: `zone "Local" depends on the host`,
		},
		{
			name:    "zone on a duration window",
			in:      "policies:\n  - {name: p, limit: 5, window: 1m, zone: UTC}\n",
			wantErr: `zone "UTC" applies to calendar windows only`,
		},
		{
			name:    "calendar window under another algorithm",
			in:      "policies:\n  - {name: p, limit: 5, window: calendar_day, algorithm: fixed_window}\n",
			wantErr: `window "calendar_day" is a calendar period, which algorithm fixed_window does not count`,
		},
		{
			name:    "calendar algorithm with a duration",
			in:      "policies:\n  - {name: p, limit: 5, window: 24h, algorithm: calendar}\n",
			wantErr: `algorithm calendar needs a calendar window: calendar_day, calendar_week, calendar_month or calendar_year, not "24h"`,
		},
		{
			name:    "resolution on a calendar window",
			in:      "policies:\n  - {name: p, limit: 5, window: calendar_year, resolution: 1ms}\n",
			wantErr: `resolution "1ms" does not apply to a calendar window`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parsePolicies([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Count(err.Error(), "\n") != 0 {
					t.Fatalf("parsePolicies(%q) = %v, want one error containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parsePolicies(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parsePolicies(%q)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
			data, err := formatPolicies(got)
			if err != nil {
				t.Fatal(err)
			}
			if back, err := parsePolicies(data); err != nil || !reflect.DeepEqual(back, got) {
				t.Fatalf("round trip: %+v, %v\nfile:\n%s", back, err, data)
			}
		})
	}
}
