package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// checkBody is a strictly decoded POST /v1/check body. Exactly one of
// Policy and Policies is set when a policy was given; Policies (the
// multi-limit form) is nil unless the body used "policies". Missing tenant,
// subject or policy stay empty: key validation names them.
type checkBody struct {
	Tenant   string   `json:"tenant"`
	Subject  string   `json:"subject"`
	Policy   string   `json:"policy,omitempty"`
	Policies []string `json:"policies,omitempty"`
	// Hits is the request's cost; 1 when the body has no "hits".
	Hits int64 `json:"hits"`
	// LeaseID is the lease to end (/v1/release), a decimal string: ids are
	// 64-bit, beyond a JSON number's exact range in many clients.
	LeaseID string `json:"lease_id,omitempty"`
	// ReservationID is the reservation to settle (/v1/settle), a decimal
	// string; Actual its actual cost, 0 or more (HasActual: given).
	ReservationID string `json:"reservation_id,omitempty"`
	Actual        int64  `json:"actual,omitempty"`
	HasActual     bool   `json:"-"`
}

// decodeCheck reads exactly one JSON object from r as a check body, more
// strictly than encoding/json's Decode, which matches field names without
// regard to case, keeps the last of duplicated fields and reads null or 0
// into hits as if it were absent (and then charged 1). Here:
//   - field names are exact and case-sensitive; unknown fields, duplicated
//     fields and anything after the object are errors;
//   - tenant, subject and policy must be strings (not null);
//   - hits, if present, must be an integer from 1 to MaxInt64 (not null, 0,
//     negative, fractional or in exponent form); absent means 1;
//   - policies must be a non-empty list of distinct strings, and cannot be
//     given together with policy.
//
// Errors from r (such as *http.MaxBytesError) are wrapped, so callers can
// tell a body too large from a bad one.
func decodeCheck(r io.Reader) (checkBody, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	var b checkBody
	if err := expectDelim(dec, '{', "the body must be a JSON object"); err != nil {
		return checkBody{}, err
	}
	seen := map[string]bool{}
	hasHits := false
	for dec.More() {
		tok, err := token(dec)
		if err != nil {
			return checkBody{}, err
		}
		name, _ := tok.(string) // object keys are always strings
		if seen[name] {
			return checkBody{}, fmt.Errorf("field %q appears twice", name)
		}
		seen[name] = true
		switch name {
		case "tenant":
			b.Tenant, err = stringValue(dec, name)
		case "subject":
			b.Subject, err = stringValue(dec, name)
		case "policy":
			b.Policy, err = stringValue(dec, name)
		case "policies":
			b.Policies, err = policiesValue(dec)
		case "hits":
			hasHits = true
			b.Hits, err = hitsValue(dec)
		case "lease_id":
			b.LeaseID, err = stringValue(dec, name)
		case "reservation_id":
			b.ReservationID, err = stringValue(dec, name)
		case "actual":
			b.HasActual = true
			b.Actual, err = actualValue(dec)
		default:
			err = fmt.Errorf("unknown field %q (fields are tenant, subject, policy or policies, hits, lease_id, reservation_id and actual, in lower case)", name)
		}
		if err != nil {
			return checkBody{}, err
		}
	}
	if err := expectDelim(dec, '}', "the object is not closed"); err != nil {
		return checkBody{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil && !isSyntaxError(err) {
			return checkBody{}, err // a read error, such as the size limit
		}
		return checkBody{}, errors.New("trailing data after the JSON object")
	}
	if seen["policy"] && seen["policies"] {
		return checkBody{}, errors.New(`give either "policy" or "policies", not both`)
	}
	if !hasHits {
		b.Hits = 1
	}
	return b, nil
}

func isSyntaxError(err error) bool {
	var se *json.SyntaxError
	return errors.As(err, &se)
}

// token reads the next token inside the object: the body ending there is
// io.ErrUnexpectedEOF, not io.EOF.
func token(dec *json.Decoder) (json.Token, error) {
	tok, err := dec.Token()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the body ends inside the object: %w", io.ErrUnexpectedEOF)
	}
	return tok, err
}

// expectDelim reads one token and requires it to be d.
func expectDelim(dec *json.Decoder, d json.Delim, msg string) error {
	tok, err := token(dec)
	if errors.Is(err, io.ErrUnexpectedEOF) && d == '{' {
		return fmt.Errorf("%s: %w", msg, err)
	}
	if err != nil {
		return err
	}
	if tok != d {
		return errors.New(msg)
	}
	return nil
}

// stringValue reads one value that must be a JSON string.
func stringValue(dec *json.Decoder, field string) (string, error) {
	tok, err := token(dec)
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("%s must be a string, not %s", field, describe(tok))
	}
	return s, nil
}

// hitsValue reads hits: an integer from 1 to MaxInt64.
func hitsValue(dec *json.Decoder) (int64, error) {
	tok, err := token(dec)
	if err != nil {
		return 0, err
	}
	num, ok := tok.(json.Number)
	if !ok {
		return 0, fmt.Errorf("invalid hits: must be a positive integer, not %s (leave hits out to mean 1)", describe(tok))
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("invalid hits %s: larger than %d", num, int64(1<<63-1))
		}
		return 0, fmt.Errorf("invalid hits %s: must be a whole number such as 1 or 5", num)
	}
	if n <= 0 {
		return 0, fmt.Errorf("invalid hits %d: must be at least 1 (leave hits out to mean 1)", n)
	}
	return n, nil
}

// actualValue reads actual: an integer from 0 to MaxInt64.
func actualValue(dec *json.Decoder) (int64, error) {
	tok, err := token(dec)
	if err != nil {
		return 0, err
	}
	num, ok := tok.(json.Number)
	if !ok {
		return 0, fmt.Errorf("invalid actual: must be a whole number of units, 0 or more, not %s", describe(tok))
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid actual %s: must be a whole number of units, 0 or more", num)
	}
	return n, nil
}

// policiesValue reads policies: a non-empty list of distinct strings.
func policiesValue(dec *json.Decoder) ([]string, error) {
	if err := expectDelim(dec, '[', "policies must be a list of policy names"); err != nil {
		return nil, err
	}
	list := []string{}
	for dec.More() {
		s, err := stringValue(dec, "each of policies")
		if err != nil {
			return nil, err
		}
		for _, p := range list {
			if p == s {
				return nil, fmt.Errorf("policy %q appears twice in policies", s)
			}
		}
		list = append(list, s)
	}
	if err := expectDelim(dec, ']', "policies is not closed"); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, errors.New("policies must name at least one policy")
	}
	return list, nil
}

// describe names a JSON token's kind for error messages.
func describe(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "the number " + string(v)
	case string:
		return "a string"
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "a list"
	}
	return "another value"
}

// checksItem is one request of a /v1/checks body: its decoded check body,
// or why it is not one.
type checksItem struct {
	body checkBody
	err  error
}

// decodeChecks reads a /v1/checks body, {"requests": [check bodies]},
// strictly: the object has exactly the field "requests", a list of at most
// max JSON values, and nothing follows it. Each value is then decoded by
// decodeCheck on its own, so a bad item (an unknown field, hits 0) fails
// alone in its checksItem; a body that is not valid JSON at all fails
// whole. Errors from r are wrapped, as by decodeCheck.
func decodeChecks(r io.Reader, max int) ([]checksItem, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	if err := expectDelim(dec, '{', `the body must be a JSON object {"requests": [...]}`); err != nil {
		return nil, err
	}
	var items []checksItem
	seen := false
	for dec.More() {
		tok, err := token(dec)
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		if name != "requests" {
			return nil, fmt.Errorf(`unknown field %q (the body is {"requests": [...]})`, name)
		}
		if seen {
			return nil, errors.New(`field "requests" appears twice`)
		}
		seen = true
		if err := expectDelim(dec, '[', "requests must be a list of check bodies"); err != nil {
			return nil, err
		}
		items = []checksItem{}
		for dec.More() {
			if len(items) == max {
				return nil, fmt.Errorf("more than %d requests: split the batch", max)
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				if !isSyntaxError(err) && !errors.Is(err, io.ErrUnexpectedEOF) {
					return nil, err // a read error, such as the size limit
				}
				return nil, fmt.Errorf("request %d: %w", len(items), err)
			}
			// The common item by quickCheck, as for /v1/check.
			b, ok := quickCheck(raw)
			var berr error
			if !ok {
				b, berr = decodeCheck(bytes.NewReader(raw))
			}
			items = append(items, checksItem{body: b, err: berr})
		}
		if err := expectDelim(dec, ']', "requests is not closed"); err != nil {
			return nil, err
		}
	}
	if err := expectDelim(dec, '}', "the object is not closed"); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil && !isSyntaxError(err) {
			return nil, err
		}
		return nil, errors.New("trailing data after the JSON object")
	}
	if !seen {
		return nil, errors.New(`the body has no "requests" list`)
	}
	return items, nil
}

// quickCheck decodes data as decodeCheck does when data is the common
// body: one object with at most the fields tenant, subject, policy, hits
// and lease_id, each once; strings of printable ASCII without escapes;
// hits a plain integer from 1 to MaxInt64; JSON whitespace between
// tokens. For any other body it reports false and decodeCheck decides,
// with its messages. Where it answers, it answers exactly as decodeCheck
// would (FuzzQuickCheck), without a json.Decoder: the decoder's state and
// its tokens, each string boxed in an interface, were most of a check's
// allocations.
func quickCheck(data []byte) (checkBody, bool) {
	const (
		tenantBit = 1 << iota
		subjectBit
		policyBit
		hitsBit
		leaseBit
	)
	var b checkBody
	i := skipJSONSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return checkBody{}, false
	}
	i = skipJSONSpace(data, i+1)
	seen := 0
	if i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			name, j, ok := quickString(data, i)
			if !ok {
				return checkBody{}, false
			}
			i = skipJSONSpace(data, j)
			if i >= len(data) || data[i] != ':' {
				return checkBody{}, false
			}
			i = skipJSONSpace(data, i+1)
			var bit int
			var field *string
			switch string(name) {
			case "tenant":
				bit, field = tenantBit, &b.Tenant
			case "subject":
				bit, field = subjectBit, &b.Subject
			case "policy":
				bit, field = policyBit, &b.Policy
			case "lease_id":
				bit, field = leaseBit, &b.LeaseID
			case "hits":
				bit = hitsBit
			default:
				return checkBody{}, false
			}
			if seen&bit != 0 {
				return checkBody{}, false
			}
			seen |= bit
			if field != nil {
				var v []byte
				v, i, ok = quickString(data, i)
				*field = string(v)
			} else {
				b.Hits, i, ok = quickHits(data, i)
			}
			if !ok {
				return checkBody{}, false
			}
			i = skipJSONSpace(data, i)
			if i < len(data) && data[i] == ',' {
				i = skipJSONSpace(data, i+1)
				continue
			}
			if i < len(data) && data[i] == '}' {
				i++
				break
			}
			return checkBody{}, false
		}
	}
	if skipJSONSpace(data, i) != len(data) {
		return checkBody{}, false
	}
	if seen&hitsBit == 0 {
		b.Hits = 1
	}
	return b, true
}

// skipJSONSpace returns the index of the first byte of data at or after i
// that is not JSON whitespace.
func skipJSONSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// quickString reads a JSON string at data[i] whose bytes are printable
// ASCII other than a backslash (so it means its bytes): its contents and
// the index after its closing quote.
func quickString(data []byte, i int) ([]byte, int, bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return data[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, i, false
		}
	}
	return nil, i, false
}

// quickHits reads a JSON number at data[i] that is a plain integer from 1
// to MaxInt64 (no sign, leading zero, fraction or exponent): its value and
// the index after it.
func quickHits(data []byte, i int) (int64, int, bool) {
	if i >= len(data) || data[i] < '1' || data[i] > '9' {
		return 0, i, false
	}
	var n int64
	j := i
	for ; j < len(data) && data[j] >= '0' && data[j] <= '9'; j++ {
		d := int64(data[j] - '0')
		if n > (1<<63-1-d)/10 {
			return 0, i, false // above MaxInt64
		}
		n = n*10 + d
	}
	if j < len(data) && (data[j] == '.' || data[j] == 'e' || data[j] == 'E') {
		return 0, i, false
	}
	return n, j, true
}
