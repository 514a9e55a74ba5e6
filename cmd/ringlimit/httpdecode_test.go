package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// TestDecodeCheck is the table of strict /v1/check bodies: what is
// accepted (and as what), and what is rejected with which message.
func TestDecodeCheck(t *testing.T) {
	ok := []struct {
		name, body string
		want       checkBody
	}{
		{"hits absent means 1", `{"tenant":"a","subject":"b","policy":"api"}`, checkBody{Tenant: "a", Subject: "b", Policy: "api", Hits: 1}},
		{"hits given", `{"hits":5,"policy":"api","subject":"b","tenant":"a"}`, checkBody{Tenant: "a", Subject: "b", Policy: "api", Hits: 5}},
		{"max hits", `{"tenant":"a","subject":"b","policy":"api","hits":9223372036854775807}`, checkBody{Tenant: "a", Subject: "b", Policy: "api", Hits: 1<<63 - 1}},
		{"policies", `{"tenant":"a","subject":"b","policies":["x","y"]}`, checkBody{Tenant: "a", Subject: "b", Policies: []string{"x", "y"}, Hits: 1}},
		{"whitespace", " \n{ \"tenant\" : \"a\" } \n", checkBody{Tenant: "a", Hits: 1}},
		{"missing parts are left to key validation", `{}`, checkBody{Hits: 1}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCheck(strings.NewReader(tc.body))
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decodeCheck(%s) = %+v, %v; want %+v", tc.body, got, err, tc.want)
			}
		})
	}
	bad := []struct{ name, body, errPart string }{
		{"hits 0", `{"tenant":"a","subject":"b","policy":"api","hits":0}`, "invalid hits 0: must be at least 1"},
		{"hits null", `{"tenant":"a","subject":"b","policy":"api","hits":null}`, "invalid hits: must be a positive integer, not null"},
		{"hits negative", `{"tenant":"a","subject":"b","policy":"api","hits":-3}`, "invalid hits -3"},
		{"hits fractional", `{"tenant":"a","subject":"b","policy":"api","hits":1.5}`, "invalid hits 1.5: must be a whole number"},
		{"hits 1.0", `{"tenant":"a","subject":"b","policy":"api","hits":1.0}`, "invalid hits 1.0"},
		{"hits exponent", `{"tenant":"a","subject":"b","policy":"api","hits":1e3}`, "invalid hits 1e3"},
		{"hits over int64", `{"tenant":"a","subject":"b","policy":"api","hits":9223372036854775808}`, "larger than 9223372036854775807"},
		{"hits string", `{"tenant":"a","subject":"b","policy":"api","hits":"2"}`, "not a string"},
		{"upper-case field", `{"TENANT":"a","subject":"b","policy":"api"}`, `unknown field "TENANT"`},
		{"mixed-case field", `{"tenant":"a","Subject":"b","policy":"api"}`, `unknown field "Subject"`},
		{"unknown field", `{"tenant":"a","subject":"b","policy":"api","limit":1000}`, `unknown field "limit"`},
		{"duplicate field", `{"tenant":"a","subject":"b","policy":"api","tenant":"c"}`, `field "tenant" appears twice`},
		{"duplicate hits", `{"tenant":"a","subject":"b","policy":"api","hits":1,"hits":2}`, `field "hits" appears twice`},
		{"tenant number", `{"tenant":1,"subject":"b","policy":"api"}`, "tenant must be a string, not the number 1"},
		{"subject null", `{"tenant":"a","subject":null,"policy":"api"}`, "subject must be a string, not null"},
		{"policy object", `{"tenant":"a","subject":"b","policy":{}}`, "policy must be a string, not an object"},
		{"policy and policies", `{"tenant":"a","subject":"b","policy":"x","policies":["y"]}`, `either "policy" or "policies"`},
		{"empty policies", `{"tenant":"a","subject":"b","policies":[]}`, "at least one policy"},
		{"duplicate policies", `{"tenant":"a","subject":"b","policies":["x","y","x"]}`, `policy "x" appears twice`},
		{"policies not a list", `{"tenant":"a","subject":"b","policies":"x"}`, "policies must be a list"},
		{"policies holds a number", `{"tenant":"a","subject":"b","policies":["x",2]}`, "each of policies must be a string"},
		{"not an object", `["tenant"]`, "must be a JSON object"},
		{"empty body", ``, "must be a JSON object"},
		{"truncated", `{"tenant":`, "unexpected EOF"},
		{"two objects", `{"tenant":"a"}{"tenant":"a"}`, "trailing data"},
		{"trailing garbage", `{"tenant":"a"} x`, "trailing data"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCheck(strings.NewReader(tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Fatalf("decodeCheck(%s) = %+v, %v; want an error containing %q", tc.body, got, err, tc.errPart)
			}
		})
	}
}

// TestCheckHandlerRejects sends bodies the strict decoder refuses to the
// /v1/check handler: each is a 400 with the decoder's message, and the node
// is never asked (the API has none, so reaching it would panic): no quota
// changes.
func TestCheckHandlerRejects(t *testing.T) {
	api := &httpAPI{}
	for _, body := range []string{
		`{"tenant":"a","subject":"b","policy":"api","hits":0}`,
		`{"tenant":"a","subject":"b","policy":"api","hits":null}`,
		`{"TENANT":"a","subject":"b","policy":"api"}`,
		`{"tenant":"a","subject":"b","policy":"api","policy":"other"}`,
		`{"tenant":"a","subject":"b","policy":"api","policies":["api","other"]}`,
	} {
		rec := httptest.NewRecorder()
		api.check(rec, httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body)))
		var resp errorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != http.StatusBadRequest || err != nil || !strings.HasPrefix(resp.Error, "bad JSON body: ") {
			t.Errorf("POST %s: %d %s, want 400 with a bad JSON body message", body, rec.Code, rec.Body)
		}
	}
}

// FuzzDecodeCheck: decodeCheck never panics; an accepted body re-encodes to
// one that decodes to the same value; a rejected one returns a zero value
// with its error. Seeds: testdata/fuzz/FuzzDecodeCheck.
func FuzzDecodeCheck(f *testing.F) {
	f.Add([]byte(`{"tenant":"a","subject":"b","policy":"api","hits":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeCheck(strings.NewReader(string(data)))
		if err != nil {
			if !reflect.DeepEqual(got, checkBody{}) {
				t.Fatalf("rejected %q with %v but returned %+v", data, err, got)
			}
			return
		}
		if got.Hits < 1 || (got.Policy != "" && got.Policies != nil) || (got.Policies != nil && len(got.Policies) == 0) {
			t.Fatalf("accepted %q as %+v", data, got)
		}
		enc, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeCheck(strings.NewReader(string(enc)))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("%q decoded as %+v, re-encoded as %s, decoded again as %+v, %v", data, got, enc, again, err)
		}
	})
}

// TestDecodeChecks is the table of /v1/checks envelopes: a bad item fails
// alone (with decodeCheck's message), a bad envelope fails whole.
func TestDecodeChecks(t *testing.T) {
	item := `{"tenant":"a","subject":"b","policy":"api"}`
	ok := []struct {
		name, body string
		wantErrs   []string // per item: "" for a decoded body, else part of its error
	}{
		{"empty list", `{"requests":[]}`, []string{}},
		{"one", `{"requests":[` + item + `]}`, []string{""}},
		{"bad item in the middle", `{"requests":[` + item + `,{"tenant":"a","hits":0},` + item + `]}`, []string{"", "invalid hits 0", ""}},
		{"item not an object", `{"requests":[[1],"x",null]}`, []string{"must be a JSON object", "must be a JSON object", "must be a JSON object"}},
		{"unknown field in an item", `{"requests":[{"tenant":"a","limit":9}]}`, []string{`unknown field "limit"`}},
		{"exactly the maximum", `{"requests":[` + strings.TrimSuffix(strings.Repeat(item+",", 3), ",") + `]}`, []string{"", "", ""}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			items, err := decodeChecks(strings.NewReader(tc.body), 3)
			if err != nil || len(items) != len(tc.wantErrs) {
				t.Fatalf("decodeChecks(%s) = %d items, %v; want %d items", tc.body, len(items), err, len(tc.wantErrs))
			}
			for i, want := range tc.wantErrs {
				got := items[i].err
				if want == "" && got != nil || want != "" && (got == nil || !strings.Contains(got.Error(), want)) {
					t.Errorf("item %d of %s: error %v, want %q", i, tc.body, got, want)
				}
			}
		})
	}
	bad := []struct{ name, body, errPart string }{
		{"too many", `{"requests":[` + strings.TrimSuffix(strings.Repeat(item+",", 4), ",") + `]}`, "more than 3 requests"},
		{"no requests", `{}`, `no "requests" list`},
		{"unknown field", `{"requests":[],"extra":1}`, `unknown field "extra"`},
		{"requests twice", `{"requests":[],"requests":[]}`, `"requests" appears twice`},
		{"requests not a list", `{"requests":{}}`, "requests must be a list"},
		{"not an object", `[]`, "must be a JSON object"},
		{"broken item", `{"requests":[{"tenant":]}`, "request 0"},
		{"truncated", `{"requests":[` + item, "unexpected EOF"},
		{"trailing data", `{"requests":[]} {}`, "trailing data"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			items, err := decodeChecks(strings.NewReader(tc.body), 3)
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Fatalf("decodeChecks(%s) = %d items, %v; want an error containing %q", tc.body, len(items), err, tc.errPart)
			}
		})
	}
}

// TestQuickCheck: the common bodies take quickCheck's way, as decodeCheck
// reads them; anything it does not read exactly (escapes, policies, hits
// 0 or with a fraction, a duplicate, an unknown field, trailing data)
// is left to decodeCheck.
func TestQuickCheck(t *testing.T) {
	for _, body := range []string{
		`{"tenant":"a","subject":"b","policy":"api"}`,
		`{"hits":5,"policy":"api","subject":"b","tenant":"a"}`,
		`{"tenant":"a","subject":"b","policy":"api","hits":9223372036854775807}`,
		" \n{ \"tenant\" : \"a\" ,\t\"lease_id\":\"42\"} \r\n",
		`{}`,
		`{"tenant":"","subject":"user 1","policy":"a:b"}`,
	} {
		got, ok := quickCheck([]byte(body))
		want, err := decodeCheck(strings.NewReader(body))
		if !ok || err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("quickCheck(%q) = %+v, %v; decodeCheck gives %+v, %v", body, got, ok, want, err)
		}
	}
	for _, body := range []string{
		`{"tenant":"a\u0062","subject":"b","policy":"api"}`,
		`{"tenant":"a\"","subject":"b","policy":"api"}`,
		"{\"tenant\":\"\xc3\xa9\"}",
		`{"tenant":"a","subject":"b","policies":["x"]}`,
		`{"tenant":"a","hits":0}`,
		`{"tenant":"a","hits":01}`,
		`{"tenant":"a","hits":1.0}`,
		`{"tenant":"a","hits":1e3}`,
		`{"tenant":"a","hits":-1}`,
		`{"tenant":"a","hits":9223372036854775808}`,
		`{"tenant":"a","tenant":"a"}`,
		`{"Tenant":"a"}`,
		`{"tenant":"a",}`,
		`{"tenant":"a"} x`,
		`{"tenant":"a"}{}`,
		`{"tenant":null}`,
		``,
		`{"tenant":"a"`,
	} {
		if got, ok := quickCheck([]byte(body)); ok {
			t.Errorf("quickCheck(%q) = %+v, want it left to decodeCheck", body, got)
		}
	}
}

// FuzzQuickCheck: whatever quickCheck accepts, decodeCheck accepts as the
// same body.
func FuzzQuickCheck(f *testing.F) {
	f.Add([]byte(`{"tenant":"a","subject":"b","policy":"api","hits":2}`))
	f.Add([]byte(` {"lease_id":"7", "hits":12 ,"tenant":"t"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := quickCheck(data)
		if !ok {
			return
		}
		want, err := decodeCheck(strings.NewReader(string(data)))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("quickCheck(%q) = %+v; decodeCheck gives %+v, %v", data, got, want, err)
		}
	})
}
