// The Control API's own OpenAPI document as a test oracle: finds the operation a request hit and checks
// a response body against the schema declared for its status (ajv 2020 + formats, compiled lazily).
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

export const API_PREFIX = '/api/v1';
export const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'patch', 'options', 'head'] as const;

/** The plain-JSON shape of an OpenAPI 3.1 document, as far as these tests read it. */
export interface OpenApiDoc {
  openapi: string;
  info: { title: string; version: string };
  paths: Record<string, Record<string, OpenApiOperation>>;
  components?: { schemas?: Record<string, JsonSchema> };
  [k: string]: unknown;
}
export type JsonSchema = Record<string, any>;
export interface OpenApiParameter { name: string; in: 'path' | 'query' | 'header' | 'cookie'; required?: boolean; schema?: JsonSchema }
export interface OpenApiOperation {
  parameters?: OpenApiParameter[];
  requestBody?: { required?: boolean; content?: Record<string, { schema?: JsonSchema }> };
  responses?: Record<string, { description?: string; content?: Record<string, { schema?: JsonSchema }> }>;
  [k: string]: unknown;
}

/** One operation of the document with a matcher for concrete request paths. */
export interface Operation {
  method: string;
  /** The templated path, e.g. `/api/v1/pools/{pool}/keys/{apiKey}`. */
  path: string;
  op: OpenApiOperation;
  pathParams: OpenApiParameter[];
  queryParams: OpenApiParameter[];
  bodySchema: JsonSchema | null;
  bodyRequired: boolean;
  /** Literal segments: a static route wins over a parameterised one, as in fastify's router. */
  specificity: number;
  regex: RegExp;
}

const COMPONENTS_ID = 'poolgate-components';
const FALLBACK_ERROR: JsonSchema = { type: 'object', required: ['message'], properties: { message: { type: 'string' } } };

/** `#/components/schemas/X` → a ref into the components registered with ajv under their own $id. */
function rewriteRefs(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(rewriteRefs);
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === '$ref' && typeof v === 'string' && v.startsWith('#/components/schemas/')) {
      out[k] = `${COMPONENTS_ID}#/$defs/${v.slice('#/components/schemas/'.length)}`;
    } else if (k === '$id') {
      continue; // ids were hoisted into components; a nested $id would change the base of relative refs
    } else {
      out[k] = rewriteRefs(v);
    }
  }
  return out;
}

export class OpenApiOracle {
  readonly operations: Operation[];
  readonly #responseAjv: Ajv2020;
  readonly #bodyAjv: Ajv2020;
  readonly #compiled = new Map<string, ValidateFunction>();

  constructor(readonly doc: OpenApiDoc) {
    this.#responseAjv = this.#makeAjv();
    this.#bodyAjv = this.#makeAjv();
    this.operations = [];
    for (const [path, item] of Object.entries(doc.paths ?? {})) {
      for (const method of HTTP_METHODS) {
        const op = item[method];
        if (!op) continue;
        const params = op.parameters ?? [];
        const body = op.requestBody?.content?.['application/json']?.schema ?? null;
        const segments = path.split('/').filter(Boolean);
        const pattern = segments.map((s) => (/^\{.+\}$/.test(s) ? '[^/]+' : s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))).join('/');
        this.operations.push({
          method: method.toUpperCase(),
          path,
          op,
          pathParams: params.filter((p) => p.in === 'path'),
          queryParams: params.filter((p) => p.in === 'query'),
          bodySchema: body,
          bodyRequired: op.requestBody?.required === true,
          specificity: segments.filter((s) => !s.startsWith('{')).length,
          regex: new RegExp(`^/${pattern}$`),
        });
      }
    }
  }

  // No meta-schema check of the document's schemas (validateSchema): compiling the 2020-12 meta-schema cost ~45 ms
  // of CPU per instance in every test process that calls api(), and openapi.test validates the whole document.
  #makeAjv(): Ajv2020 {
    const ajv = new Ajv2020({ allErrors: true, strict: false, validateFormats: true, validateSchema: false });
    addFormats(ajv);
    ajv.addSchema({ $id: COMPONENTS_ID, $defs: rewriteRefs(this.doc.components?.schemas ?? {}) as object });
    return ajv;
  }

  /** The operation fastify would route METHOD path to (query string ignored), or null. */
  match(method: string, rawPath: string): Operation | null {
    const path = rawPath.split('?')[0]!;
    const m = method.toUpperCase();
    let best: Operation | null = null;
    for (const op of this.operations) {
      if (op.method === m && op.regex.test(path) && (!best || op.specificity > best.specificity)) best = op;
    }
    return best;
  }

  #compile(cacheKey: string, ajv: Ajv2020, schema: JsonSchema): ValidateFunction {
    let fn = this.#compiled.get(cacheKey);
    if (!fn) {
      fn = ajv.compile(rewriteRefs(schema) as object);
      this.#compiled.set(cacheKey, fn);
    }
    return fn;
  }

  /** ajv's errors for a request body against the operation's body schema; null when it validates. */
  bodyErrors(op: Operation, body: unknown): string | null {
    if (!op.bodySchema) return null;
    const fn = this.#compile(`body ${op.method} ${op.path}`, this.#bodyAjv, op.bodySchema);
    return fn(body) ? null : this.#bodyAjv.errorsText(fn.errors);
  }

  /**
   * Checks one response against the document. Returns null when it conforms, else what is wrong.
   * Unknown routes and undeclared statuses must still carry the Error body when they are 4xx/5xx.
   */
  checkResponse(method: string, rawPath: string, status: number, contentType: string, body: unknown, rawText: string): string | null {
    const path = rawPath.split('?')[0]!;
    if (!path.startsWith(`${API_PREFIX}/`) || method.toUpperCase() === 'HEAD') return null;
    const op = this.match(method, path);
    const declared = op?.op.responses?.[String(status)] ?? op?.op.responses?.[`${String(status)[0]}XX`] ?? op?.op.responses?.default;
    const isJson = /^application\/(?:[\w.+-]+\+)?json\b/i.test(contentType);
    const where = `${method.toUpperCase()} ${op?.path ?? path} → ${status}`;
    let schema: JsonSchema | undefined;
    let cacheKey: string;
    if (declared) {
      schema = declared.content?.['application/json']?.schema;
      if (!schema) return rawText === '' ? null : `${where}: the document declares no body, got ${JSON.stringify(rawText.slice(0, 200))}`;
      cacheKey = `res ${op!.method} ${op!.path} ${status}`;
    } else if (status >= 400) {
      schema = this.doc.components?.schemas?.Error ? { $ref: '#/components/schemas/Error' } : FALLBACK_ERROR;
      cacheKey = 'res Error';
    } else if (op) {
      return `${where}: status ${status} is not declared in the OpenAPI document (declared: ${Object.keys(op.op.responses ?? {}).join(', ')})`;
    } else {
      return null; // an undocumented success route (the OpenAPI document itself)
    }
    if (!isJson) return `${where}: expected a JSON body, got content-type ${JSON.stringify(contentType)}: ${JSON.stringify(rawText.slice(0, 200))}`;
    const fn = this.#compile(cacheKey, this.#responseAjv, schema);
    if (fn(body)) return null;
    return `${where}: response body does not match the OpenAPI schema: ${this.#responseAjv.errorsText(fn.errors)}; body ${JSON.stringify(body).slice(0, 500)}`;
  }
}

/** Fills a templated path with values, e.g. fill('/pools/{pool}', { pool: 'a' }). Values are inserted as given. */
export function fillPath(template: string, values: Record<string, string>): string {
  return template.replace(/\{([^}]+)\}/g, (_, name: string) => {
    const v = values[name];
    if (v === undefined) throw new Error(`no value for path parameter ${name} of ${template}`);
    return v;
  });
}
