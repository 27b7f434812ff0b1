// Validates generated outputs against their JSON Schemas with ajv.
// Input: a JSON-lines file; each line {"schema": S, "outputs": ["<text>", ...]}.
// Exit 0 when every output parses as JSON and validates; 1 otherwise (the failures printed);
// 77 when ajv is not installed.
'use strict';
const fs = require('fs');
const path = require('path');
let Ajv;
try {
    const nm = process.env.SPARK_NODE_MODULES || path.join(__dirname, '..', 'node_modules');
    Ajv = require(path.join(nm, 'ajv', 'dist', '2020.js')).default;
} catch (e) {
    console.log('SKIP: ajv not installed (' + e.message + ')');
    process.exit(77);
}
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: true });
// The formats the grammar compiler supports (RFC 3339 and friends), checked strictly.
const DATE = /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/;
const TIME = /^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/i;
ajv.addFormat('date', DATE);
ajv.addFormat('time', TIME);
ajv.addFormat('date-time', (s) => {
    const i = s.search(/[Tt ]/);
    return i > 0 && DATE.test(s.slice(0, i)) && TIME.test(s.slice(i + 1));
});
ajv.addFormat('uuid', /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
ajv.addFormat('email', /^[a-z0-9!#$%&'*+/=?^_`{|}~.-]+@[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*$/i);
ajv.addFormat('uri', /^[a-z][a-z0-9+.-]*:[^\s]*$/i);
ajv.addFormat('ipv4', /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/);

const file = process.argv[2];
const lines = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length);
let schemas = 0, outputs = 0, bad = 0;
for (const line of lines) {
    const rec = JSON.parse(line);
    let validate;
    try {
        validate = ajv.compile(rec.schema);
    } catch (e) {
        console.log('schema does not compile in ajv: ' + e.message + '\n  ' + JSON.stringify(rec.schema));
        bad++;
        continue;
    }
    schemas++;
    for (const text of rec.outputs) {
        outputs++;
        let v;
        try {
            v = JSON.parse(text);
        } catch (e) {
            console.log('not JSON: ' + JSON.stringify(text));
            bad++;
            continue;
        }
        if (!validate(v)) {
            bad++;
            if (bad < 20)
                console.log('INVALID: ' + JSON.stringify(text) + '\n  schema ' + JSON.stringify(rec.schema) +
                            '\n  errors ' + JSON.stringify(validate.errors));
        }
    }
}
console.log(`ajv: ${schemas} schemas, ${outputs} outputs, ${bad} failures`);
process.exit(bad || outputs === 0 ? 1 : 0);
