// JSON encoding of column values: every database value becomes a JSON value that holds it exactly
// (big integers and decimals as strings, binary as base64, timestamps as ISO 8601 strings, json as JSON).
import pg from 'pg';
import { mysql2 } from './mysql2.js';

/** A column of a result as the response reports it: its name and the database's name for its type. */
export interface Column {
  name: string;
  type: string;
}

type Parse = (text: string) => unknown;

const asString: Parse = (v) => v;
const asInteger: Parse = (v) => Number(v);
/** JSON has no NaN or infinities: they travel as the strings PostgreSQL prints. */
const asFloat: Parse = (v) => {
  const n = Number(v);
  return Number.isFinite(n) ? n : v;
};
const asBoolean: Parse = (v) => v === 't' || v === 'true';
const asJson: Parse = (v) => JSON.parse(v);

/** pg's own parser for a type OID (its typings only list the built-in scalar OIDs). */
const pgParser = pg.types.getTypeParser as unknown as (oid: number, format: 'text') => (v: string) => unknown;

/** `\x0102…` (bytea_output hex) or the old escape format → base64. */
const defaultBytea = pgParser(17, 'text') as (v: string) => Buffer;
const asBytea: Parse = (v) => (v.startsWith('\\x') ? Buffer.from(v.slice(2), 'hex') : defaultBytea(v)).toString('base64');

/** `2024-01-02 03:04:05.123456` → `2024-01-02T03:04:05.123456` (no zone: the value has none). */
const asTimestamp: Parse = (v) => (/^\d{4,}-\d\d-\d\d \d/.test(v) ? v.replace(' ', 'T') : v);

/**
 * `2024-01-02 03:04:05.123456+00` → `2024-01-02T03:04:05.123456Z`; another session zone keeps its offset
 * (`+05:30`). Microseconds are kept (a JS Date would cut them). `infinity` and BC dates stay as printed.
 */
const asTimestamptz: Parse = (v) => {
  const m = /^(\d{4,}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d+)?)([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?$/.exec(v);
  if (!m) return v;
  const [, date, time, sign, hh, mm = '00', ss] = m;
  if (hh === '00' && mm === '00' && (ss === undefined || ss === '00')) return `${date}T${time}Z`;
  return `${date}T${time}${sign}${hh}:${mm}${ss ? `:${ss}` : ''}`;
};

/** Element parsers by PostgreSQL type OID (text format). Types not listed are returned as their text. */
const SCALARS = new Map<number, Parse>([
  [16, asBoolean], // bool
  [17, asBytea], // bytea
  [20, asString], // int8: beyond 2^53, so a string
  [21, asInteger], // int2
  [23, asInteger], // int4
  [26, asInteger], // oid
  [700, asFloat], // float4
  [701, asFloat], // float8
  [1700, asString], // numeric
  [790, asString], // money
  [114, asJson], // json
  [3802, asJson], // jsonb
  [1114, asTimestamp], // timestamp
  [1184, asTimestamptz], // timestamptz
]);

/** Array OID → element OID, for the arrays of the types above (other arrays come back as string arrays). */
const ARRAYS = new Map<number, number>([
  [1000, 16], [1001, 17], [1016, 20], [1005, 21], [1007, 23], [1028, 26], [1021, 700], [1022, 701],
  [1231, 1700], [791, 790], [199, 114], [3807, 3802], [1115, 1114], [1185, 1184],
]);
const TEXT_ARRAY_OIDS = [1009, 1015, 1014, 2951, 1182, 1183, 1270, 1187, 1041, 651, 1040];

/** pg's text[] parser splits and unquotes any array literal into (nested) string arrays. */
const parseTextArray = pgParser(1009, 'text');

function mapDeep(v: unknown, parse: Parse): unknown {
  if (v === null) return null;
  if (Array.isArray(v)) return v.map((x) => mapDeep(x, parse));
  return parse(v as string);
}

const PARSERS = new Map<number, Parse>(SCALARS);
for (const [arrayOid, elemOid] of ARRAYS) {
  const elem = SCALARS.get(elemOid)!;
  PARSERS.set(arrayOid, (v) => mapDeep(parseTextArray(v), elem));
}
for (const oid of TEXT_ARRAY_OIDS) PARSERS.set(oid, parseTextArray);

/** The `types` option of a pg client: every value arrives as text and is parsed by the table above. */
export const pgTypes = {
  getTypeParser(oid: number, format?: string): Parse {
    if (format === 'binary') return asString;
    return PARSERS.get(oid) ?? asString;
  },
};

// MySQL / MariaDB. mysql2 runs with dateStrings and bigNumberStrings, so values arrive as strings for
// dates, BIGINT and DECIMAL, as numbers for the other numeric types, and as Buffers for binary columns.
let types: Record<string, number> | null = null;
const BINARY_CHARSET = 63;

/** The MySQL name of a column's type, telling binary strings from text by the binary charset. */
export function mysqlTypeName(field: { columnType?: number; characterSet?: number; type?: number }): string {
  const T = (types ??= mysql2().Types as unknown as Record<string, number>);
  const code = field.columnType ?? field.type ?? -1;
  const binary = field.characterSet === BINARY_CHARSET;
  switch (code) {
    case T.DECIMAL:
    case T.NEWDECIMAL:
      return 'decimal';
    case T.TINY:
      return 'tinyint';
    case T.SHORT:
      return 'smallint';
    case T.INT24:
      return 'mediumint';
    case T.LONG:
      return 'int';
    case T.LONGLONG:
      return 'bigint';
    case T.FLOAT:
      return 'float';
    case T.DOUBLE:
      return 'double';
    case T.NULL:
      return 'null';
    case T.TIMESTAMP:
      return 'timestamp';
    case T.DATE:
    case T.NEWDATE:
      return 'date';
    case T.TIME:
      return 'time';
    case T.DATETIME:
      return 'datetime';
    case T.YEAR:
      return 'year';
    case T.BIT:
      return 'bit';
    case T.JSON:
      return 'json';
    case T.ENUM:
      return 'enum';
    case T.SET:
      return 'set';
    case T.GEOMETRY:
      return 'geometry';
    case T.TINY_BLOB:
    case T.MEDIUM_BLOB:
    case T.LONG_BLOB:
    case T.BLOB:
      return binary ? 'blob' : 'text';
    case T.VARCHAR:
    case T.VAR_STRING:
      return binary ? 'varbinary' : 'varchar';
    case T.STRING:
      return binary ? 'binary' : 'char';
    default:
      return `type${code}`;
  }
}

/** Converts one mysql2 value of a column whose type name is `type` to its JSON form. */
export function mysqlValue(type: string, v: unknown): unknown {
  if (v === null || v === undefined) return null;
  switch (type) {
    case 'datetime':
      // A DATETIME has no zone: ISO form without one.
      return typeof v === 'string' ? v.replace(' ', 'T') : v;
    case 'timestamp':
      // The session runs with time_zone '+00:00', so a TIMESTAMP is printed in UTC.
      return typeof v === 'string' && /^\d{4}-\d\d-\d\d \d/.test(v) ? `${v.replace(' ', 'T')}Z` : v;
    case 'bit':
      if (Buffer.isBuffer(v)) {
        // BIT(n) as an unsigned integer; a string past 2^53.
        const n = v.reduce((acc, b) => (acc << 8n) | BigInt(b), 0n);
        return n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n.toString();
      }
      return v;
    case 'json':
      return typeof v === 'string' ? JSON.parse(v) : v;
    default:
      if (Buffer.isBuffer(v)) return v.toString('base64');
      if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
      return v;
  }
}

/** A request parameter as mysql2 should escape it: objects and arrays go as JSON text. */
export function mysqlParam(v: unknown): unknown {
  return v !== null && typeof v === 'object' ? JSON.stringify(v) : v;
}
