// schema.js - checks a JSON value against a JSON Schema, in the page, so
// that JSON mode's reply is marked valid or not by the client itself.
// Covers the keywords guided decoding generates from: type, enum, const,
// properties / required / additionalProperties / patternProperties /
// min- and maxProperties / propertyNames, items / prefixItems /
// min- and maxItems / uniqueItems / contains, min- and maxLength /
// pattern, minimum / maximum / exclusive bounds / multipleOf, allOf /
// anyOf / oneOf / not, if / then / else, and $ref within the document
// (#/$defs/..., #/definitions/...).  Formats only annotate.
// Returns a list of errors, each "path: what"; empty when valid.
"use strict";

const typeOf = (v) => {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v; // string, boolean, object
};

const typeMatches = (v, t) => t === typeOf(v) || (t === "number" && typeOf(v) === "integer");

function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => equal(x, b[i]));
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && equal(a[k], b[k]));
}

function resolve(root, ref) {
  if (!ref.startsWith("#")) return null;
  let node = root;
  for (const raw of ref.slice(1).split("/").filter((p) => p !== "")) {
    let key;
    try {
      key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    } catch (e) {
      return null;
    }
    if (node === null || typeof node !== "object" || !(key in node)) return null;
    node = node[key];
  }
  return node;
}

const chars = (s) => Array.from(s).length; // code points, as the specification counts

// A schema's pattern as a RegExp: with Unicode semantics where it compiles so,
// else without (escapes like \- that the u flag refuses); null if neither.
function pattern(p) {
  for (const flags of ["u", ""]) {
    try {
      return new RegExp(p, flags);
    } catch (e) {
      /* next */
    }
  }
  return null;
}

function check(v, s, path, root, errs, depth) {
  if (s === true || s === undefined) return;
  if (s === false) return void errs.push(`${path}: no value is allowed here`);
  if (typeof s !== "object" || s === null) return;
  if (depth > 64) return void errs.push(`${path}: the schema nests too deep`);
  if (typeof s.$ref === "string") {
    const t = resolve(root, s.$ref);
    if (t === null) errs.push(`${path}: unresolved $ref ${s.$ref}`);
    else check(v, t, path, root, errs, depth + 1);
  }
  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (!types.some((t) => typeMatches(v, t))) errs.push(`${path}: ${typeOf(v)} where ${types.join(" or ")} is wanted`);
  }
  if (Array.isArray(s.enum) && !s.enum.some((e) => equal(e, v))) errs.push(`${path}: not one of the enum's values`);
  if ("const" in s && !equal(s.const, v)) errs.push(`${path}: not the const value`);
  const t = typeOf(v);
  if (t === "string") {
    if (typeof s.minLength === "number" && chars(v) < s.minLength) errs.push(`${path}: shorter than ${s.minLength}`);
    if (typeof s.maxLength === "number" && chars(v) > s.maxLength) errs.push(`${path}: longer than ${s.maxLength}`);
    if (typeof s.pattern === "string") {
      const re = pattern(s.pattern); // one JavaScript cannot read is not checked
      if (re && !re.test(v)) errs.push(`${path}: does not match ${s.pattern}`);
    }
  }
  if (t === "number" || t === "integer") {
    // Draft 4 writes exclusive bounds as booleans beside minimum / maximum.
    if (typeof s.minimum === "number" && (s.exclusiveMinimum === true ? v <= s.minimum : v < s.minimum))
      errs.push(`${path}: below ${s.minimum}${s.exclusiveMinimum === true ? " or equal" : ""}`);
    if (typeof s.maximum === "number" && (s.exclusiveMaximum === true ? v >= s.maximum : v > s.maximum))
      errs.push(`${path}: above ${s.maximum}${s.exclusiveMaximum === true ? " or equal" : ""}`);
    if (typeof s.exclusiveMinimum === "number" && v <= s.exclusiveMinimum) errs.push(`${path}: not above ${s.exclusiveMinimum}`);
    if (typeof s.exclusiveMaximum === "number" && v >= s.exclusiveMaximum) errs.push(`${path}: not below ${s.exclusiveMaximum}`);
    if (typeof s.multipleOf === "number" && s.multipleOf > 0) {
      const q = v / s.multipleOf;
      if (Math.abs(q - Math.round(q)) > 1e-9 * Math.max(1, Math.abs(q))) errs.push(`${path}: not a multiple of ${s.multipleOf}`);
    }
  }
  if (t === "array") {
    const prefix = Array.isArray(s.prefixItems) ? s.prefixItems : Array.isArray(s.items) ? s.items : [];
    v.forEach((x, i) => {
      if (i < prefix.length) check(x, prefix[i], `${path}[${i}]`, root, errs, depth + 1);
      else if (s.items !== undefined && !Array.isArray(s.items)) check(x, s.items, `${path}[${i}]`, root, errs, depth + 1);
      else if (Array.isArray(s.items) && s.additionalItems !== undefined)
        check(x, s.additionalItems, `${path}[${i}]`, root, errs, depth + 1);
    });
    if (typeof s.minItems === "number" && v.length < s.minItems) errs.push(`${path}: fewer than ${s.minItems} items`);
    if (typeof s.maxItems === "number" && v.length > s.maxItems) errs.push(`${path}: more than ${s.maxItems} items`);
    if (s.uniqueItems === true && v.some((x, i) => v.findIndex((y) => equal(x, y)) !== i)) errs.push(`${path}: items repeat`);
    if (s.contains !== undefined && !v.some((x) => valid(x, s.contains, root, depth + 1)))
      errs.push(`${path}: no item matches contains`);
  }
  if (t === "object") {
    const keys = Object.keys(v), props = s.properties || {};
    for (const k of Array.isArray(s.required) ? s.required : [])
      if (!Object.prototype.hasOwnProperty.call(v, k)) errs.push(`${path}: "${k}" is required`);
    for (const k of keys) {
      let covered = false;
      if (Object.prototype.hasOwnProperty.call(props, k)) {
        covered = true;
        check(v[k], props[k], `${path}.${k}`, root, errs, depth + 1);
      }
      for (const [p, ps] of Object.entries(s.patternProperties || {})) {
        const re = pattern(p);
        if (re === null) covered = true; // unreadable here: not held against the key
        else if (re.test(k)) {
          covered = true;
          check(v[k], ps, `${path}.${k}`, root, errs, depth + 1);
        }
      }
      if (!covered && s.additionalProperties !== undefined) {
        if (s.additionalProperties === false) errs.push(`${path}: "${k}" is not allowed`);
        else check(v[k], s.additionalProperties, `${path}.${k}`, root, errs, depth + 1);
      }
      if (s.propertyNames !== undefined) check(k, s.propertyNames, `${path} (name "${k}")`, root, errs, depth + 1);
    }
    const deps = Object.assign({}, s.dependentRequired || {}, s.dependencies || {});
    for (const [k, d] of Object.entries(deps))
      if (Object.prototype.hasOwnProperty.call(v, k)) {
        if (Array.isArray(d)) {
          for (const r of d) if (!Object.prototype.hasOwnProperty.call(v, r)) errs.push(`${path}: "${r}" is required with "${k}"`);
        } else check(v, d, path, root, errs, depth + 1);
      }
    for (const [k, d] of Object.entries(s.dependentSchemas || {}))
      if (Object.prototype.hasOwnProperty.call(v, k)) check(v, d, path, root, errs, depth + 1);
    if (typeof s.minProperties === "number" && keys.length < s.minProperties) errs.push(`${path}: fewer than ${s.minProperties} members`);
    if (typeof s.maxProperties === "number" && keys.length > s.maxProperties) errs.push(`${path}: more than ${s.maxProperties} members`);
  }
  if (Array.isArray(s.allOf)) s.allOf.forEach((x) => check(v, x, path, root, errs, depth + 1));
  if (Array.isArray(s.anyOf) && !s.anyOf.some((x) => valid(v, x, root, depth + 1))) errs.push(`${path}: matches none of anyOf`);
  if (Array.isArray(s.oneOf)) {
    const n = s.oneOf.filter((x) => valid(v, x, root, depth + 1)).length;
    if (n !== 1) errs.push(`${path}: matches ${n} of oneOf, not exactly one`);
  }
  if (s.not !== undefined && valid(v, s.not, root, depth + 1)) errs.push(`${path}: matches not`);
  if (s.if !== undefined) {
    if (valid(v, s.if, root, depth + 1)) check(v, s.then, path, root, errs, depth + 1);
    else check(v, s.else, path, root, errs, depth + 1);
  }
}

function valid(v, s, root, depth) {
  const errs = [];
  check(v, s, "$", root, errs, depth);
  return errs.length === 0;
}

export function validate(value, schema) {
  const errs = [];
  check(value, schema, "$", schema, errs, 0);
  return errs;
}
