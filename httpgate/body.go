package httpgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/policy"
)

// A request body's problems are told in the body's own terms (fields and
// JSON types, where in the body), never in encoding/json's, which speak
// of Go structs and types the caller has never seen.

// decodeJSON decodes data into v strictly (no unknown fields, one value
// and nothing after it) and returns what is wrong with it, or "".
func decodeJSON(data []byte, v any) string {
	if len(bytes.TrimSpace(data)) == 0 {
		return "the body is empty: send a JSON object"
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// An error inside one take of a batch is told with its index.
		if _, batch := v.(*TakeRequest); batch {
			if msg := takesProblem(data); msg != "" {
				return msg
			}
		}
		return jsonProblem(err, v, "")
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Sprintf("unexpected data after the JSON value, which ends at byte %d: send one JSON object", end)
	}
	return ""
}

// takesProblem finds the first take of a batch that does not decode and
// says what is wrong with it, as "takes[i]...". "" when the error is not
// in a take.
func takesProblem(data []byte) string {
	var batch struct {
		Takes []json.RawMessage `json:"takes"`
	}
	if json.Unmarshal(data, &batch) != nil {
		return ""
	}
	for i, raw := range batch.Takes {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var it TakeItem
		if err := dec.Decode(&it); err != nil {
			return jsonProblem(err, &it, fmt.Sprintf("takes[%d]", i))
		}
	}
	return ""
}

// jsonProblem says what err, from decoding into v, means for the body;
// at, when not "", is where in the body v was ("takes[3]").
func jsonProblem(err error, v any, at string) string {
	where := func(field string) string {
		switch {
		case at == "" && field == "":
			return "the body"
		case at == "":
			return field
		case field == "":
			return at
		}
		return at + "." + field
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the body ends before the JSON value does"
	case errors.As(err, &te):
		// Field is the path from v without array indices ("takes.cost").
		field := strings.ReplaceAll(te.Field, ".", "[].")
		if num, ok := strings.CutPrefix(te.Value, "number "); ok && te.Type.Kind() == reflect.Float64 {
			return fmt.Sprintf("%s: %s is out of range: want a finite number", where(field), num)
		}
		return fmt.Sprintf("%s: want %s, got %s", where(field), jsonKind(te.Type), jsonValue(te.Value))
	}
	// encoding/json has no type for an unknown field.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		known := jsonFields(v)
		msg := fmt.Sprintf("%s: unknown field %q", where(""), name)
		if s := policy.Suggest(name, known); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return msg + "; the fields are " + strings.Join(known, ", ")
	}
	return "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
}

// jsonKind names, in JSON's terms, what a Go type decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// jsonValue names the kind of JSON value encoding/json reports ("number",
// "string", "bool", "array", "object").
func jsonValue(v string) string {
	switch v {
	case "bool":
		return "true or false"
	case "array", "object":
		return "an " + v
	case "number", "string":
		return "a " + v
	}
	return v
}

// jsonFields lists the JSON fields of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}
