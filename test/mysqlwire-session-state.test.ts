// What pins a MySQL client (issue 14): the statement-text rules of src/db/mysqlwire/session-state.ts, one
// case per rule in docs/mysqlwire.md ("Session state: automatic pinning").
import t from 'tap';
import { CLEAR, DIRTY, PIN, sessionEffects } from '../src/db/mysqlwire/session-state.js';

const q = (sql: string) => Buffer.concat([Buffer.from([0x03]), Buffer.from(sql, 'utf8')]);
const fx = (sql: string, inTransaction = false) => sessionEffects(q(sql), 'appdb', inTransaction);

t.test('ordinary statements have no effect (the hot path)', async (t) => {
  for (const sql of ['SELECT 1', 'select c from sbtest1 where id=5', "INSERT INTO t VALUES (1, 'a@b.c')", 'UPDATE t SET a = 1', 'BEGIN', 'COMMIT', 'DELETE FROM t', 'SELECT @x', 'SELECT @@session.sql_mode', 'SHOW TABLES', 'CREATE TABLE t2 (x INT)']) {
    t.equal(fx(sql), 0, sql);
  }
});

t.test('what pins, and for which reason', async (t) => {
  const cases: Array<[string, number]> = [
    ["SET @v = 'a'", PIN.user_variable],
    ["SELECT 'a' INTO @v", PIN.user_variable],
    ['SELECT a, b FROM t INTO @x, @y', PIN.user_variable],
    ['SELECT @n := COUNT(*) FROM t', PIN.user_variable],
    ['CALL p(@out)', PIN.user_variable | DIRTY],
    ["SET @a = 1, sql_mode = ''", PIN.user_variable | PIN.set],
    ["SET SESSION sql_mode = 'ANSI'", PIN.set],
    ['SET @@session.wait_timeout = 10', PIN.set],
    ['SET sql_mode = ""', PIN.set],
    ['SET NAMES latin1', PIN.set],
    ['set character set utf8', PIN.set],
    ['SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED', PIN.set],
    ['SET TRANSACTION ISOLATION LEVEL SERIALIZABLE', PIN.set],
    ['CREATE TEMPORARY TABLE tmp (x INT)', PIN.temp_table],
    ['create or replace temporary table tmp (x int)', PIN.temp_table],
    ["SELECT GET_LOCK('a', 0)", PIN.get_lock],
    ["select Get_Lock('a', 0)", PIN.get_lock],
    ['LOCK TABLES t READ', PIN.lock_tables],
    ['USE information_schema', PIN.use_database],
    ["PREPARE s FROM 'SELECT 1'", PIN.prepared_statement],
    ['HANDLER t OPEN', PIN.handler],
    ['/* comment */ SET @v = 1', PIN.user_variable],
    ['SELECT 1; SET @v = 2', PIN.user_variable],
  ];
  for (const [sql, bits] of cases) t.equal(fx(sql), bits, sql);
});

t.test('what does not pin', async (t) => {
  t.equal(fx('SET STATEMENT max_statement_time=1 FOR SELECT 1'), 0, 'SET STATEMENT lasts one statement');
  t.equal(fx('SET GLOBAL max_connections = 10'), DIRTY, 'SET GLOBAL: no session state (the connection is still reset)');
  t.equal(fx('SET autocommit = 0'), DIRTY, 'autocommit is followed through the status flags');
  t.equal(fx('SET TRANSACTION ISOLATION LEVEL SERIALIZABLE', true), 0, 'SET TRANSACTION inside a transaction');
  t.equal(fx('CALL p(1)'), DIRTY, 'CALL marks the connection for reset only');
  t.equal(fx('USE appdb'), CLEAR.use_database | DIRTY, "USE of the pool's database unpins");
  t.equal(fx('USE `appdb`'), CLEAR.use_database | DIRTY);
});

t.test('what unpins', async (t) => {
  t.equal(fx('UNLOCK TABLES'), CLEAR.lock_tables);
  t.equal(fx('SELECT RELEASE_ALL_LOCKS()'), CLEAR.get_lock);
});
