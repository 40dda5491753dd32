/* schema.h: an OpenAI response_format JSON schema compiled into a GBNF
 * grammar for constrained sampling.
 *
 * Contract: cv_schema_grammar takes the schema itself (the "schema" member
 * of response_format.json_schema; the caller unwraps it) and returns a
 * NUL-terminated GBNF grammar (release with cv_free) whose start
 * rule is `root`, or NULL with one sentence in err naming the keyword or
 * value it cannot honour and its place as a JSON pointer ("#/properties/
 * a/pattern"). Every complete sentence of the grammar is a JSON text that
 * validates against the schema (a subset of those texts: the grammar may
 * narrow, never widen). Keywords it does not implement are refused, never
 * ignored; annotations (title, description, examples, default, $schema,
 * $id, $anchor, $comment, deprecated, readOnly, writeOnly, contentEncoding,
 * contentMediaType) are ignored.
 *
 * Supported: type (a name or a list), enum, const, properties (emitted in
 * the schema's order; required ones always, optional ones may be left
 * out), required, additionalProperties (false: only listed properties;
 * absent or true: after the listed ones, extra keys that differ from every
 * listed one, written without escapes, with any value; a schema: extra
 * keys with values of that schema), items, prefixItems (and draft-07 items
 * arrays with additionalItems), minItems, maxItems, minLength, maxLength,
 * minimum, maximum, exclusiveMinimum, exclusiveMaximum (exact integer
 * ranges for integers; numbers within the bounds written without an
 * exponent), format date, time, date-time, uuid (other formats are
 * annotations and ignored), pattern (an ECMAScript regular expression, a
 * search unless anchored, compiled by regex.h: classes, groups,
 * alternation, quantifiers, ^ and $ at the ends; the rest refused by name;
 * minLength, maxLength or a format beside it refused), anyOf, oneOf
 * (taken as anyOf: branches that overlap may let through a text valid for
 * two of them), allOf of object
 * schemas (merged), $ref to any "#/..." pointer (recursion allowed; a
 * cycle that consumes no input is refused), boolean schemas, uniqueItems
 * false. A schema without "type" takes the type its keywords imply
 * (properties: object; items: array; minLength, pattern: string...), else
 * any value.
 *
 * The text is compact JSON: no whitespace anywhere except at most one
 * optional space after each ':' and ','. Strings hold no raw control
 * characters or DEL, escapes are \" \\ \/ \b \f \n \r \t and \uXXXX
 * without surrogates or U+0000; minLength/maxLength count characters (an
 * escape is one); what a pattern places is written in one encoding (see
 * regex.h). Numbers: an optional '-', an integer part of at most 16
 * digits without leading zeros, an optional fraction of 1 to 16 digits,
 * an optional exponent of 1 or 2 digits (none under bounds). With every
 * maxLength / maxItems bounded, no open "any value" and no pattern with an
 * unbounded repetition or an open end, the language is finite.
 *
 * cv_schema_any_object_grammar is the grammar for response_format
 * {"type":"json_object"}: any JSON object, written as above. */
#ifndef CONVOY_SERVE_SCHEMA_H
#define CONVOY_SERVE_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

char *cv_schema_grammar(const json_t *schema, char *err, size_t errlen);
char *cv_schema_any_object_grammar(void);

#endif
