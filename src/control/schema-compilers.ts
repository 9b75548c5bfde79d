// The Control API's schema compilers: ajv for request bodies (exact: no coercion, no stripping) and for path and
// query strings (coerced, defaults applied), fast-json-stringify for responses. Each route's schemas are compiled
// at its first request, not at start-up: compiling all of them took ~0.3 s of CPU per start (about a
// tenth of a service's start), and a process serves a handful of routes for a long time or many for a short
// one. compileAll() compiles what is left, so a test can prove every schema compiles.
//
// Neither ajv checks a schema against the JSON Schema meta-schema when it is added or compiled: each instance
// compiled the meta-schema's own validator for that, ~25 ms of CPU per instance and two instances per start,
// to check schemas that are constants of this code. compileAll() checks every one of them (a test runs it).
import { Ajv, type Options as AjvOptions, type ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';
import fastJsonStringify, { type AnySchema, type Schema } from 'fast-json-stringify';
import type { TSchema } from '@sinclair/typebox';

const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv;

type RouteSchema = { schema: unknown; httpPart?: string };
/** What fastify calls to validate: false leaves the reasons in `errors`, as ajv's own functions do. */
export type LazyValidator = ((data: unknown) => boolean) & { errors?: ValidateFunction['errors'] };

function makeAjv(opts: AjvOptions, shared: readonly TSchema[]): Ajv {
  const ajv = new Ajv({ allErrors: false, strict: false, validateSchema: false, ...opts });
  addFormats(ajv);
  for (const s of shared) ajv.addSchema(s);
  return ajv;
}

export class SchemaCompilers {
  readonly #bodyAjv: Ajv;
  readonly #textAjv: Ajv;
  /** The shared schemas by $id: the `$ref`s of response schemas resolve against them. */
  readonly #byId: Record<string, Schema>;
  /** Compiles of schemas no request has needed yet. */
  readonly #pending = new Set<() => unknown>();
  /** Every schema given to this object (shared and per route), for compileAll's meta-schema check. */
  readonly #schemas: object[] = [];

  /** `make` run once, at the first call of what this returns (or at compileAll). */
  #lazily<F>(make: () => F): () => F {
    let made: F | null = null;
    const get = (): F => {
      if (made === null) {
        made = make();
        this.#pending.delete(get);
      }
      return made;
    };
    this.#pending.add(get);
    return get;
  }

  constructor(shared: readonly TSchema[]) {
    this.#bodyAjv = makeAjv({ coerceTypes: false, removeAdditional: false, useDefaults: false }, shared);
    this.#textAjv = makeAjv({ coerceTypes: true, removeAdditional: false, useDefaults: true }, shared);
    this.#byId = Object.fromEntries(shared.map((s) => [s.$id!, s as unknown as Schema]));
    this.#schemas.push(...shared);
  }

  /** fastify's validatorCompiler. */
  readonly validator = ({ schema, httpPart }: RouteSchema): LazyValidator => {
    const ajv = httpPart === 'body' ? this.#bodyAjv : this.#textAjv;
    this.#schemas.push(schema as object);
    const compiled = this.#lazily(() => ajv.compile(schema as object));
    const validate: LazyValidator = (data) => {
      const fn = compiled();
      const ok = fn(data) as boolean;
      validate.errors = fn.errors;
      return ok;
    };
    return validate;
  };

  /** fastify's serializerCompiler (what fastify's default does: a schema is not also passed as its own external). */
  readonly serializer = ({ schema }: RouteSchema): ((data: unknown) => string) => {
    const s = schema as TSchema;
    this.#schemas.push(s);
    const compiled = this.#lazily(() => {
      let external = this.#byId;
      if (s.$id && s.$id in external) {
        external = { ...external };
        delete external[s.$id];
      }
      return fastJsonStringify(s as AnySchema, { schema: external }) as (data: unknown) => string;
    });
    return (data) => compiled()(data);
  };

  /**
   * Checks every schema against the meta-schema (what ajv skips at start-up, see above), then compiles every
   * schema not compiled yet; throws for the first schema that is not valid or does not compile.
   */
  compileAll(): void {
    const meta = makeAjv({ validateSchema: true }, []);
    for (const schema of this.#schemas) {
      if (!meta.validateSchema(schema)) throw new Error(`schema ${JSON.stringify(schema).slice(0, 200)} is not valid: ${meta.errorsText(meta.errors)}`);
    }
    for (const compile of this.#pending) compile();
  }
}
